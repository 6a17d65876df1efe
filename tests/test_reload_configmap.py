"""Hot reload of a bundle that Kubernetes projects from a ConfigMap, and of a bundle
directory published by swapping a symlink.

The kubelet's atomic writer updates a projected volume in this order: write a new
`..<timestamp>` directory in full, rename a new `..data` link over the old one, create
the top-level links (`bundle.yaml -> ..data/bundle.yaml`, `tools -> ..data/tools`), and
delete the old timestamped directory. `ProjectedVolume` replays those steps one by one.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest
from conftest import EXAMPLE_BUNDLE

from toolauthz.bundle import load_bundle
from toolauthz.server import reload as reload_module
from toolauthz.server.build import build_sidecar
from toolauthz.server.config import Settings
from toolauthz.server.reload import BundleReloader, bundle_snapshot, fingerprint, load_bundle_snapshot

FORBID_MEASURE = ('@id("no-measurements-today")\n'
                  'forbid (principal, action == Action::"tool:measure_runtime", resource);\n')


def example_payload() -> dict[str, bytes]:
    """The example bundle as a ConfigMap carries it: relative path -> content (no tests/)."""
    return {path.relative_to(EXAMPLE_BUNDLE).as_posix(): path.read_bytes()
            for path in sorted(EXAMPLE_BUNDLE.rglob("*"))
            if path.is_file() and not path.relative_to(EXAMPLE_BUNDLE).as_posix().startswith("tests/")}


class ProjectedVolume:
    """A directory laid out and updated the way the kubelet updates a ConfigMap volume."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        root.mkdir()
        self._generation = 0

    def write_payload(self, files: dict[str, bytes]) -> pathlib.Path:
        """Step 1: a new timestamped directory, not yet visible through `..data`."""
        self._generation += 1
        target = self.root / f"..2026_05_0{self._generation}_10_00_00.00000000{self._generation}"
        for rel, data in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return target

    def swap(self, target: pathlib.Path) -> pathlib.Path | None:
        """Step 2: atomically point `..data` at `target`; returns the previous target."""
        data = self.root / "..data"
        previous = pathlib.Path(os.path.realpath(data)) if os.path.lexists(data) else None
        tmp = self.root / "..data_tmp"
        os.symlink(target.name, tmp)
        os.replace(tmp, data)
        return previous

    def link_and_clean(self, target: pathlib.Path, previous: pathlib.Path | None) -> None:
        """Steps 3 and 4: the user-visible links, then the old directory goes."""
        for entry in target.iterdir():
            link = self.root / entry.name
            if not os.path.lexists(link):
                os.symlink(f"..data/{entry.name}", link)
        if previous is not None:
            shutil.rmtree(previous)

    def publish(self, files: dict[str, bytes]) -> None:
        target = self.write_payload(files)
        previous = self.swap(target)
        self.link_and_clean(target, previous)


def plain_version(files: dict[str, bytes], where: pathlib.Path) -> str:
    """The version the same files get in an ordinary directory."""
    for rel, data in files.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_bytes(data)
    return load_bundle(where).version


@pytest.fixture
def volume(tmp_path) -> ProjectedVolume:
    projected = ProjectedVolume(tmp_path / "policies")
    projected.publish(example_payload())
    return projected


@pytest.fixture
def projected_sidecar(tmp_path, volume, clock):
    settings = Settings(bundle=volume.root, data_dir=tmp_path / "data", listen="127.0.0.1:0",
                        audit={"checkpoint_interval_seconds": 3600}, reload_poll_seconds=0)
    car = build_sidecar(settings, clock=clock)
    yield car
    car.close()


def test_a_projected_bundle_has_the_version_of_its_content(projected_sidecar, volume, tmp_path):
    # Pods of a fleet project the same ConfigMap under different timestamped names: the
    # version stamped on every decision must name the content, not the directory.
    bundle = projected_sidecar.bundles.current
    assert bundle.version == plain_version(example_payload(), tmp_path / "plain")
    assert bundle.directory == volume.root  # GetStatus names the configured directory


def test_a_reload_before_the_swap_never_reads_the_new_directory(projected_sidecar, volume):
    before = projected_sidecar.bundles.current.version
    half_written = example_payload()
    half_written["refunds.cedar"] = half_written["refunds.cedar"][:40]  # the kubelet is mid-write
    half_written["zz_forbid.cedar"] = FORBID_MEASURE.encode()
    volume.write_payload(half_written)

    assert fingerprint(volume.root) == projected_sidecar.reloader._seen
    assert projected_sidecar.reloader.reload() is False  # SIGHUP now: nothing new is published
    assert projected_sidecar.bundles.current.version == before
    assert projected_sidecar.reloader.last_error == ""


def test_a_configmap_swap_is_reloaded_whole(projected_sidecar, volume, tmp_path):
    new = {**example_payload(), "zz_forbid.cedar": FORBID_MEASURE.encode()}
    seen_before = fingerprint(volume.root)
    target = volume.write_payload(new)
    assert fingerprint(volume.root) == seen_before  # still writing: nothing to react to
    previous = volume.swap(target)
    assert fingerprint(volume.root) != seen_before  # the swap alone is a change
    assert projected_sidecar.reloader.reload() is True  # before the links and the cleanup
    volume.link_and_clean(target, previous)

    bundle = projected_sidecar.bundles.current
    assert bundle.version == plain_version(new, tmp_path / "plain")
    assert "no-measurements-today" in bundle.policies
    assert projected_sidecar.reloader.reload() is False  # the cleanup changes nothing that is read


def test_the_watcher_reloads_a_swapped_configmap(tmp_path, volume):
    from toolauthz.bundle import BundleHolder

    holder = BundleHolder(load_bundle_snapshot(volume.root))
    new = {**example_payload(), "zz_forbid.cedar": FORBID_MEASURE.encode()}
    expected = plain_version(new, tmp_path / "plain")
    reloader = BundleReloader(holder, poll_seconds=0.01).start()
    try:
        volume.publish(new)
        attempts = 0
        while holder.current.version != expected and attempts < 50:
            assert reloader.wait_for_attempt(reloader.attempts, timeout=30)
            attempts += 1
        assert holder.current.version == expected
        assert reloader.last_error == ""
    finally:
        reloader.close()


def test_a_swap_in_the_middle_of_a_load_reads_the_new_snapshot(volume, tmp_path, monkeypatch):
    # The kubelet deletes the old directory right after the swap: a load that started on
    # it fails half-way, and must read the new snapshot instead of reporting an error.
    new = {**example_payload(), "zz_forbid.cedar": FORBID_MEASURE.encode()}
    real_read = reload_module.read_snapshot
    calls = []

    def read_during_a_swap(directory):
        calls.append(pathlib.Path(directory))
        if len(calls) == 1:
            volume.publish(new)  # the directory being read is gone now
        return real_read(directory)

    monkeypatch.setattr(reload_module, "read_snapshot", read_during_a_swap)
    bundle = load_bundle_snapshot(volume.root)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert bundle.version == plain_version(new, tmp_path / "plain")


def test_a_bundle_directory_published_by_a_symlink_swap(tmp_path, clock):
    # `ln -sfn releases/v2 current`: the configured path is a link that a deploy replaces.
    releases = tmp_path / "releases"
    shutil.copytree(EXAMPLE_BUNDLE, releases / "v1")
    shutil.copytree(EXAMPLE_BUNDLE, releases / "v2")
    (releases / "v2" / "zz_forbid.cedar").write_text(FORBID_MEASURE)
    current = tmp_path / "current"
    os.symlink(releases / "v1", current)
    assert bundle_snapshot(current) == (releases / "v1").resolve()

    holder_bundle = load_bundle_snapshot(current)
    from toolauthz.bundle import BundleHolder

    reloader = BundleReloader(BundleHolder(holder_bundle), poll_seconds=0)
    seen = fingerprint(current)
    os.symlink(releases / "v2", tmp_path / "current.tmp")
    os.replace(tmp_path / "current.tmp", current)
    assert fingerprint(current) != seen
    assert reloader.reload() is True
    assert "no-measurements-today" in reloader._holder.current.policies
    assert reloader._holder.current.directory == current


def test_the_fingerprint_follows_links_and_survives_a_loop(tmp_path):
    shared_tools = tmp_path / "shared_tools"
    shutil.copytree(EXAMPLE_BUNDLE / "tools", shared_tools)
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE_BUNDLE, bundle, ignore=shutil.ignore_patterns("tools"))
    os.symlink(shared_tools, bundle / "tools")
    os.symlink(bundle, shared_tools / "loop")
    first = fingerprint(bundle)
    assert first == fingerprint(bundle)
    (shared_tools / "lookup_order.yaml").write_text("changed: true\n")
    assert fingerprint(bundle) != first  # a file reached only through a link is watched
