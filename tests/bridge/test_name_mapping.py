"""Mapping rules from a file cannot hang a conversion: RE2 matches in time linear in the name."""
import pytest

from trainkit.bridge.name_mapping import apply_rules, load_rules
from trainkit.errors import ConfigError


def rules_of(tmp_path, text):
    (tmp_path / "mapping.yaml").write_text(text)
    return load_rules(tmp_path / "mapping.yaml")


def test_a_catastrophic_pattern_returns_on_a_41_character_name(tmp_path):
    # Python's backtracking `re` tries 2**40 ways to split the a's before it gives up on the trailing "b".
    rules = rules_of(tmp_path, "- {pattern: '^(a+)+$', replace: null}\n- {pattern: '^(a+)+b$', replace: 'x'}\n")
    assert apply_rules("a" * 40 + "b", rules) == "x"
    assert apply_rules("a" * 41, rules) is None
    assert apply_rules("a" * 39 + "bc", rules) == "a" * 39 + "bc"


def test_groups_in_replacements_work_as_with_re_sub(tmp_path):
    rules = rules_of(tmp_path, r"- {pattern: '^layer(\d+)\.(?P<rest>.*)$', replace: 'stage\1.\g<rest>'}" + "\n")
    assert apply_rules("layer3.0.conv1.weight", rules) == "stage3.0.conv1.weight"


def test_a_pattern_re2_cannot_match_in_linear_time_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        rules_of(tmp_path, r"- {pattern: '(a)\1', replace: 'b'}" + "\n")
    text = str(error.value)
    assert "rule 0: pattern '(a)\\\\1' is not a valid regular expression: invalid escape sequence" in text, text
    assert "no backreferences or lookaround" in text and "\n" not in text
