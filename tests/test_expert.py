"""The scripted expert's plan, written by the action format in use (the warm start's demonstrations)."""

from __future__ import annotations

import numpy as np
import pytest

from agent_r1.training.expert import expert_plan

RECORD = {"question": "Where was the founder of Velmora Labs born?", "answers": np.array(["Quorvale", "Q."]),
          "supporting_titles": np.array(["Velmora Labs", "Ilsa Brandt"]),
          "sub_queries": np.array(["Velmora Labs founder", "Ilsa Brandt"])}


@pytest.mark.parametrize("fmt, expected", [
    ("tags", ["<search>Velmora Labs founder</search>", "<search>Ilsa Brandt</search>", "<answer>Quorvale</answer>"]),
    ("tool_call", ['<tool_call>{"name": "search", "arguments": {"query": "Velmora Labs founder"}}</tool_call>',
                   '<tool_call>{"name": "search", "arguments": {"query": "Ilsa Brandt"}}</tool_call>',
                   "<answer>Quorvale</answer>"]),
])
def test_expert_plan_is_written_in_the_format(fmt: str, expected: list[str]) -> None:
    assert expert_plan(RECORD, fmt) == expected
    # without sub-queries (parquet gives an empty array), each hop searches its supporting title
    no_subs = {**RECORD, "sub_queries": np.array([])}
    assert expert_plan(no_subs, fmt)[0] == expected[0].replace("Velmora Labs founder", "Velmora Labs")


def test_expert_plan_rejects_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown action format 'xml'"):
        expert_plan(RECORD, "xml")
