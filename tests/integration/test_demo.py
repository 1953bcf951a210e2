import pytest

from deploy.demo import run_demo

pytestmark = pytest.mark.integration


def test_demo_closes_the_loop_and_the_swap_changes_outputs(stack):
    # run_demo returns True only if greedy outputs changed after the swap and the new traces
    # carry the new checkpoint version.
    assert run_demo(stack)
