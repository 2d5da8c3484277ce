"""serve-bench's settings through the ranks, resolved from the profile's run.json before any rank starts."""

import json
import shutil

import pytest

from ppprof.run.resolve import resolve_serve
from tests.multirank import TINY_RUN

FLAGS = dict(
    concurrency=None, request_rate=None, strategies=None, pp_size=None, spec="300,700", num_prompts=4,
    async_depth=None, seed=None, repeats=1, out=None, profile={},
)  # fmt: skip


def test_a_closed_loop_on_the_profiles_stages():
    serve, policy = resolve_serve(str(TINY_RUN / "policy.json"), {**FLAGS, "concurrency": "1,2", "profile": {}})
    assert [lv.concurrency for lv in serve.levels] == [1, 2] and policy.planning_model is not None
    assert serve.profile.pools.max_total_tokens >= 2 * 704


def test_poisson_levels_under_tp_are_refused_in_one_line(tmp_path):
    folder = tmp_path / "tp"
    shutil.copytree(TINY_RUN, folder)
    run = json.loads((folder / "run.json").read_text())
    run["config"].update(tp_size=2, nproc_per_node=4)
    (folder / "run.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match=r"^--request-rate with the profile's --tp-size 2: .* use --concurrency"):
        resolve_serve(str(folder / "policy.json"), {**FLAGS, "request_rate": "2", "profile": {}})
