"""The `toolauthz` console script (and `python -m toolauthz.cli`).

SIGHUP is deferred before anything heavy is imported: `toolauthz serve` treats it as a
request to reload the bundle, and the imports of the command line (grpc, cedarpy, the
bundle loader...) take most of a second, during which the default action would end the
process with status 129. `serve` takes the deferral over (and honours a SIGHUP that came
meanwhile once its reloader runs); any other command gives it up, and a SIGHUP that came
meanwhile then acts as it would have.

`pip install toolauthz` is the runtime SDK alone (`toolauthz.client`); the commands need
the server's dependencies (`pip install 'toolauthz[server]'`). In an SDK-only install the
script says so and which extra to install, instead of a traceback.
"""

from __future__ import annotations

import sys

from toolauthz.server.reload_requests import install_early

SERVER_EXTRA_MISSING = 2  # exit status: the command cannot run in this install


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["hook"]:  # runs before every tool use of an agent: none of the server's imports
        from toolauthz.cli.hook import main as hook

        return hook(args)
    install_early()
    try:
        from toolauthz.cli.main import main as run  # the heavy imports
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not missing or missing == "toolauthz":
            raise  # a broken checkout, not a missing extra
        print(f"toolauthz: the commands need the server's dependencies, which this install lacks "
              f"(no module `{missing}`): pip install 'toolauthz[server]'", file=sys.stderr)
        return SERVER_EXTRA_MISSING
    return run(argv)
