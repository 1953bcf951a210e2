"""`flywheel deployments create|scale`: the command line made into the API's body, and a
mistake said in one line before anything is sent."""

import pytest
import typer

from deploy.cli.deployments import replicas_body


def test_a_count_a_range_and_the_knobs():
    assert replicas_body(None, None, None, None, None, None, None, None) == {"replicas": 1}
    assert replicas_body(3, None, None, None, None, None, None, None) == {"replicas": 3}
    assert replicas_body(None, 0, 3, 2.0, None, 30.0, 60.0, None) == {
        "replicas": {"min": 0, "max": 3},
        "autoscale": {"target_concurrency": 2.0, "scale_down_delay_s": 30.0, "scale_to_zero_after_s": 60.0},
    }
    assert replicas_body(None, 1, 2, None, None, None, None, None, 500.0) == {
        "replicas": {"min": 1, "max": 2},
        "autoscale": {"ttft_p90_ms": 500.0},
    }


@pytest.mark.parametrize(
    "args",
    [
        (2, 1, 3, None, None, None, None, None),  # a count and a range
        (None, 1, None, None, None, None, None, None),  # half a range
        (None, None, None, 4.0, None, None, None, None),  # knobs without a range
    ],
)
def test_mixed_up_options_are_refused(args):
    with pytest.raises(typer.BadParameter):
        replicas_body(*args)
