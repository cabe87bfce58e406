"""A loc-scale effect's record: :func:`drop_orphaned_parents` drops a centred parents'
effect whose children are gone and keeps a non-centred one (read from its own rows) without
``children``, up the levels, in the given order. Mutation seen failing: the ``while`` loop
run once (``for _ in range(1):``): the centred countries above dropped centred regions
stay."""

from __future__ import annotations

from pymc_bigdata.model.loc_scale_effect import LocScaleEffect, drop_orphaned_parents


def _effect(name: str, centred: bool, children: str | None) -> LocScaleEffect:
    """A record with only what the rule reads: its name, form and children."""
    return LocScaleEffect(
        name=name,
        centred=centred,
        effect=name,
        effect_slice=slice(0, 2),
        loc=None,
        loc_slice=None,
        loc_value=0.0,
        scale="s",
        scale_slice=slice(2, 3),
        scale_transform="log",
        children=children,
    )


def test_orphans_go_up_the_levels():
    countries, regions = _effect("c", True, "r"), _effect("r", True, "a")
    other = _effect("b", False, "gone")
    kept = drop_orphaned_parents([countries, other, regions])
    assert [(e.name, e.children) for e in kept] == [("b", None)]


def test_parents_with_their_children_stay():
    levels = [_effect("c", True, "r"), _effect("r", False, "a"), _effect("a", True, None)]
    assert drop_orphaned_parents(levels) == levels
