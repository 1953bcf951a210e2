import pytest

from deploy.demo import run_demo
from feedback.registry import Registry

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("full", [False, True], ids=["lora", "full-weights"])
def test_one_demo_turn_raises_the_reward_through_a_real_hot_swap(stack, full):
    result = run_demo(stack, turns=1, seed=0, full=full)
    before, after = result["rewards"]
    assert after > before, result  # the swapped checkpoint serves different, better outputs
    assert len(result["versions"]) == 1 and result["plot"].endswith(".png")
    ckpt = Registry(stack.home_path / "checkpoints.json").get(result["versions"][0])
    assert ckpt.kind == ("full" if full else "lora")
