"""Engine configuration: shipped defaults, deep-merged overrides, unknown keys rejected."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streams.config import (
    EngineConfig,
    config_section,
    deep_merge,
    load_config,
    section_defaults,
    state_key,
)
from streams.detectors import ALL_DETECTORS
from streams.detectors.imbalance import ImbalanceDetector
from streams.errors import ConfigError


def test_the_shipped_defaults_cover_every_knob_of_my_detectors() -> None:
    import streams.detectors.baseline as baseline
    import streams.detectors.imbalance as imbalance
    import streams.detectors.progress as progress

    cfg = EngineConfig.default()
    assert cfg.allowed_lateness_ms == 5000
    for module, section in ((progress, "progress"), (imbalance, "imbalance"), (baseline, "baseline")):
        shipped = dict(cfg.detectors[section])
        assert shipped == module.DEFAULTS


def test_an_override_file_changes_only_the_knobs_it_names(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine: {allowed_lateness_s: 10}\ndetectors: {imbalance: {straggler_buckets: 4}}\n")
    cfg = load_config(f)
    assert cfg.allowed_lateness_ms == 10_000
    assert cfg.detectors["imbalance"]["straggler_buckets"] == 4
    assert cfg.detectors["imbalance"]["straggler_threshold"] == 0.75


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("engin: {}\n", "engin"),
        ("engine: {lateness: 3}\n", "engine.lateness"),
        ("detectors: {imbalanse: {}}\n", "detectors.imbalanse"),
        ("detectors: {imbalance: {straggler_treshold: 0.5}}\n", "straggler_treshold"),
        ("- a\n", "mapping"),
        ("engine: {allowed_lateness_s: -1}\n", "allowed_lateness_s"),
    ],
)
def test_a_bad_config_is_rejected_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(f)


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_deep_merge_merges_nested_mappings_and_replaces_the_rest() -> None:
    assert deep_merge({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2]}}) == {"a": {"b": 1, "c": [2]}}


def test_every_loaded_detector_has_a_section_or_defaults() -> None:
    assert {c.__name__ for c in ALL_DETECTORS} >= {
        "ProgressDetector",
        "ImbalanceDetector",
        "BaselineDetector",
    }


def _shared_sections() -> dict[str, list[type]]:
    """Config sections read by more than one detector class (rules split out of one detector)."""
    by_section: dict[str, list[type]] = {}
    for cls in ALL_DETECTORS:
        by_section.setdefault(config_section(cls), []).append(cls)
    return {s: classes for s, classes in by_section.items() if len(classes) > 1}


def test_rules_split_out_of_one_detector_read_its_section_with_the_same_knobs() -> None:
    shared = _shared_sections()
    assert {"numerical"} <= set(shared)
    cfg = EngineConfig.default()
    for section, classes in shared.items():
        defaults = section_defaults(section)
        assert defaults is not None
        # The shipped file names every knob of the section once, as the one detector did.
        assert dict(cfg.detectors[section]) == defaults, section
        for cls in classes:
            assert cfg.params_for(cls) == cfg.detectors[section]
            own = sys.modules[cls.__module__].DEFAULTS
            # A knob several rules read has one default.
            assert {k: defaults[k] for k in own} == own, cls.__name__


def test_a_knob_of_a_split_rule_is_set_in_its_old_section(tmp_path: Path) -> None:
    from streams.detectors.grad_spike import GradSpikeDetector
    from streams.detectors.nonfinite_grad import NonfiniteGradDetector

    f = tmp_path / "c.yaml"
    f.write_text("detectors: {numerical: {grad_spike_factor: 5.0, skipped_overflow_steps: 4}}\n")
    cfg = load_config(f)
    assert cfg.params_for(GradSpikeDetector)["grad_spike_factor"] == 5.0
    assert cfg.params_for(NonfiniteGradDetector)["skipped_overflow_steps"] == 4
    f.write_text("detectors: {numerical: {grad_spike_factr: 5.0}}\n")
    with pytest.raises(ConfigError, match=r"numerical\.grad_spike_factr.*grad_spike_factor"):
        load_config(f)


def test_every_detector_class_keeps_its_state_under_a_key_of_its_own() -> None:
    keys = [state_key(cls) for cls in ALL_DETECTORS]
    assert len(keys) == len(set(keys))
    shared = {cls for classes in _shared_sections().values() for cls in classes}
    for cls in ALL_DETECTORS:
        section = config_section(cls)
        # A class alone in its section keeps the section (older snapshots still restore it).
        expected = f"{section}/{cls.__name__}" if cls in shared else section
        assert state_key(cls) == expected


def test_a_knob_renamed_to_buckets_is_named_in_the_error(tmp_path: Path) -> None:
    """An override file from before the per-bucket straggler rule fails with the knob's new name."""
    f = tmp_path / "c.yaml"
    f.write_text("detectors: {imbalance: {straggler_windows: 2}}\n")
    with pytest.raises(ConfigError, match=r"straggler_windows; it is straggler_buckets now"):
        load_config(f)
    f.write_text("detectors: {imbalance: {straggler_buckets: 4}}\n")
    assert load_config(f).params_for(ImbalanceDetector)["straggler_buckets"] == 4


# Where the shipped file and a rule module's DEFAULTS still say different things: (section, knob).
# None since the imbalance split: windows.py's DEFAULTS compare memory across a job's GPUs too.
KNOWN_DISAGREEMENTS: set[tuple[str, str]] = set()


def test_the_shipped_file_and_every_rule_modules_defaults_say_the_same_but_the_known_ones() -> None:
    """Issue 31.3: every knob the shipped detectors.yaml sets is the code's default, every code knob
    is in the file, so a default changed in one place and not the other fails here."""
    import yaml

    from streams.config import DEFAULT_CONFIG_PATH

    shipped = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())["detectors"]
    differ: set[tuple[str, str]] = set()
    for section in sorted({config_section(c) for c in ALL_DETECTORS}):
        code = section_defaults(section)
        knobs = shipped.get(section) or {}
        if code is None:
            continue  # a section whose knobs are not declared in code (not checked on load either)
        assert set(code) == set(knobs), f"detectors.{section}: in code only {set(code) - set(knobs)}"
        differ |= {(section, k) for k, v in knobs.items() if code[k] != v}
    assert differ == KNOWN_DISAGREEMENTS
