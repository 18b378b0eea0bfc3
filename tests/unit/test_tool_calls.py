"""The shared tool layer's pure parts (integrations/tools.py): a model's arguments, whatever their
type, become exec arguments or an observation saying what is wrong, never an exception."""

from __future__ import annotations

import math

import pytest
from rlsandbox.integrations.tools import Observation, _bash, number, parse, view_text


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0.0), ("", 0.0), (3, 3.0), ("2.5", 2.5), (True, None), ("soon", None), ([1], None), (math.inf, None), ("nan", None)],
)
def test_a_models_number(value: object, expected: float | None) -> None:
    assert number(value) == expected


def test_bash_arguments_or_what_is_wrong() -> None:
    assert _bash({"command": "ls", "timeout": "7"}, 120.0, "/w") == {"command": "ls", "timeout": 7.0, "cwd": "/w"}
    assert _bash({"command": "ls"}, 120.0, "") == {"command": "ls", "timeout": 120.0}
    for bad in (
        {"command": " "},
        {"command": "ls", "timeout": -1},
        {"command": "ls", "timeout": {}},
        {"command": "ls", "cwd": 3},
    ):
        assert isinstance(_bash(bad, 120.0, ""), Observation), bad


def test_view_takes_lines_a_model_gives_in_any_form() -> None:
    text = "\n".join(f"line {i}" for i in range(1, 11))
    assert view_text(text, {"start": "3", "end": 4.0}).text == "     3\tline 3\n     4\tline 4\n[6 more lines: view with start=5]"
    assert "line numbers" in view_text(text, {"start": "top"}).text
    assert parse('{"tool": "view", "path": "a"}') == {"tool": "view", "path": "a"}
    assert parse("echo {x}") == {"tool": "bash", "command": "echo {x}"}
