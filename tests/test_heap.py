"""The serving process freezes its bundle out of the garbage collector's reach; that is
only safe if a replaced bundle is freed by reference counting alone."""

from __future__ import annotations

import gc
import weakref

import pytest
from conftest import ROOT

from toolauthz.bundle import BundleHolder, load_bundle
from toolauthz.server.heap import freeze_long_lived, keep_bundles_frozen
from toolauthz.server.reload import BundleReloader


@pytest.fixture
def no_automatic_gc():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.fixture
def unfreeze_after():
    yield
    gc.unfreeze()


def test_a_dropped_bundle_is_freed_without_the_collector(no_automatic_gc):
    bundle = load_bundle(ROOT / "policies")
    gc.collect()  # what loading left behind, not the bundle
    alive = [weakref.ref(bundle), *(weakref.ref(s) for s in bundle.tools.values()),
             *(weakref.ref(s.tool) for s in bundle.tools.values())]
    del bundle
    assert [r for r in alive if r() is not None] == []  # freed by reference counting
    assert gc.collect() == 0  # and it left no cycle behind for a collection to find


def test_freezing_moves_live_objects_out_of_reach(unfreeze_after):
    gc.unfreeze()
    freeze_long_lived()
    assert gc.get_freeze_count() > 0


class ServingSidecar:
    """What keep_bundles_frozen needs of a sidecar: its reloader."""

    def __init__(self, bundle_dir):
        self.holder = BundleHolder(load_bundle(bundle_dir))
        self.reloader = BundleReloader(self.holder, poll_seconds=0)


def test_a_serving_process_refreezes_after_each_swap(bundle_dir, unfreeze_after):
    car = ServingSidecar(bundle_dir)
    keep_bundles_frozen(car)
    assert car.reloader.after_swap is freeze_long_lived
    swaps = []
    car.reloader.after_swap = lambda: swaps.append(car.holder.current.version)
    assert car.reloader.reload() is False and swaps == []  # nothing changed: nothing swapped
    (bundle_dir / "zz_extra.cedar").write_text(
        '@id("extra") forbid (principal, action == Action::"tool:measure_runtime", resource);\n')
    assert car.reloader.reload() is True
    assert swaps == [car.holder.current.version]
