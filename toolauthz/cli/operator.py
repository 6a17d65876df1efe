"""What an operator reaches for on day one: `version`, `config reference|schema|check`
and `completion bash|zsh`."""

from __future__ import annotations

import argparse
import json
import sys

from toolauthz.cli.output import add_json_only_output, add_output_option, wants_json
from toolauthz.display.escape import display


def version_text() -> str:
    from toolauthz.server.version import build_info

    info = build_info()
    return f"toolauthz {info.version}\n" + "\n".join(f"  {line}" for line in info.lines()[1:])


class _VersionAction(argparse.Action):
    """`toolauthz --version`: what `toolauthz version` prints, without a command."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def cmd_version(args: argparse.Namespace) -> int:
    from toolauthz.server.version import build_info

    if wants_json(args):
        print(json.dumps(build_info().as_dict(), indent=2))
    else:
        print(version_text())
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from toolauthz.server.config.loading import ENVIRONMENT, problems_of, read_config_file
    from toolauthz.server.config.reference import json_schema_text, render_reference

    if args.config_command == "reference":
        print(render_reference(ENVIRONMENT), end="")
    elif args.config_command == "schema":
        print(json_schema_text(), end="")
    else:
        # The file alone: neither the environment nor defaults of the development setup.
        found = problems_of({"generate_missing_keys": False, **read_config_file(args.file)})
        if found and wants_json(args):
            print(json.dumps({"file": args.file, "valid": False, "problems": found}))
        for problem in found:  # one per line: each is one mistake
            print(f"{display(args.file)}: {problem}", file=sys.stderr)
        if found:
            return 1
        if wants_json(args):
            print(json.dumps({"file": args.file, "valid": True}))
        else:
            print(f"ok: {args.file} is a valid configuration", file=sys.stderr)
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(args.parser, shell=args.shell), end="")
    return 0


def add_operator_commands(parser: argparse.ArgumentParser,
                          sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser.add_argument("--version", action=_VersionAction, help="print the version and what it was built with")

    version = sub.add_parser("version", help="the version, commit, Python, Cedar and proto package")
    add_output_option(version)
    version.set_defaults(func=cmd_version)

    config = sub.add_parser("config", help="the configuration file: its reference, JSON Schema, and a check")
    verbs = config.add_subparsers(dest="config_command", required=True)
    verbs.add_parser("reference", help="every key with its type, default and meaning, as Markdown "
                                       "(docs/configuration.md)")
    schema = verbs.add_parser("schema", help="the JSON Schema of the configuration file, for editors")
    add_json_only_output(schema, "a JSON Schema")
    check = verbs.add_parser("check", help="validate a configuration file without serving (exit 0 or 1)")
    check.add_argument("file", help="the YAML configuration file")
    add_output_option(check)
    config.set_defaults(func=cmd_config)

    completion = sub.add_parser("completion", help="a shell completion script: "
                                                   "`source <(toolauthz completion bash)`")
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=cmd_completion, parser=parser)
