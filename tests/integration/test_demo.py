"""`flywheel demo`: the loop on the built-in task (``tail`` = the last word, a name the warmed
base never saw) gets it right on held-back tasks more often turn after turn."""

import re
from pathlib import Path

import httpx
import pytest

from deploy.cli.loop import run_demo
from feedback.registry import Registry

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_afterwards")]


def test_three_grpo_turns_make_the_served_model_solve_most_held_back_tasks(stack):
    result = run_demo(stack, turns=3, seed=0)
    exact = [t["eval"]["exact_solve"] for t in result["turns"]]
    print(f"\ndemo exact-solve per turn: {exact}")
    assert result["ok"] and exact[-1] >= 0.5 and exact[-1] > exact[0], exact
    assert len(result["turns"]) == 4 and result["plot"].endswith(".png")
    ckpt = Registry(stack.home_path / "checkpoints.json").get(result["turns"][-1]["version"])
    assert ckpt.kind == "lora" and ckpt.turn == 3
    # the checkpoints page the demo prints: each turn's checkpoint under its parent, with the
    # traces it served (its rollouts and eval) and their mean reward
    ui = result["ui"]
    with httpx.Client(base_url=ui["url"].split("/ui/")[0], timeout=60, follow_redirects=True) as browser:
        login = browser.post("/ui/login", data={"key": Path(ui["key_file"]).read_text().strip(), "next": "/ui/checkpoints"})
        assert login.status_code == 200 and str(login.url) == ui["url"], login.text[:500]
        page = login.text
    for t in result["turns"][1:]:
        row = re.search(rf'<tr class="checkpoint" data-version="{t["version"]}" data-parent="([^"]*)">(.*?)</tr>', page, re.S)
        assert row, t["version"]
        served = int(re.search(r'checkpoint=[^"]+">([\d,]+)</a>', row.group(2)).group(1).replace(",", ""))
        assert served >= 64, (t["version"], served)  # at least its held-back eval


def test_one_rejection_sampling_turn_on_every_weight_reloaded_in_place_solves_more(stack):
    result = run_demo(stack, turns=1, seed=1, full=True)
    before, after = (t["eval"]["exact_solve"] for t in result["turns"])
    assert after > before, result["turns"]
    ckpt = Registry(stack.home_path / "checkpoints.json").get(result["turns"][-1]["version"])
    assert ckpt.kind == "full" and ckpt.dataset["kind"] == "sft"
