"""Trace ids sort by the time they were made (a lookup by id prunes Parquet row groups by their id
range), and stay unguessable and in the shape response ids are made from."""

import re
import time

from traces.ids import new_trace_id
from serve.translate.responses_answer import response_id, trace_id_of


def test_ids_sort_by_time_and_keep_80_random_bits():
    made = []
    for _ in range(5):
        made.append(new_trace_id())
        time.sleep(0.002)
    assert made == sorted(made)
    assert all(re.fullmatch(r"tr-[0-9a-f]{32}", t) for t in made)
    millis = int(made[-1][3:15], 16)
    assert abs(millis - time.time() * 1000) < 60_000  # the leading digits are the millisecond
    same_ms = {new_trace_id()[15:] for _ in range(1000)}
    assert len(same_ms) == 1000  # the random tail never repeats
    assert trace_id_of(response_id(made[0])) == made[0]
