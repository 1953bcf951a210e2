import pytest

from deploy.demo import run_demo

pytestmark = pytest.mark.integration


def test_one_demo_turn_raises_the_reward_through_a_real_hot_swap(stack):
    result = run_demo(stack, turns=1, seed=0)
    before, after = result["rewards"]
    assert after > before, result  # the swapped checkpoint serves different, better outputs
    assert len(result["versions"]) == 1 and result["plot"].endswith(".png")
