"""``local_server.start`` when the server process dies before it answers: the error says it exited (with its
exit code and output) at once, instead of waiting out the start-up limit and blaming a slow server."""

from __future__ import annotations

import os

import pytest

from skillopt.core.errors import SkillOptError
from skillopt.shell import local_server


def test_a_server_that_exits_at_once_is_reported_as_exited_with_its_output(tmp_path):
    # A `prefect` package that fails on import stands in for a broken installation: the server helper
    # (`python -m skillopt.shell.prefect_server`) imports Prefect first and dies with its traceback.
    broken = tmp_path / "broken"
    (broken / "prefect").mkdir(parents=True)
    (broken / "prefect" / "__init__.py").write_text('raise ImportError("this Prefect is broken")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), os.environ.get("PYTHONPATH", "")])}
    home = tmp_path / "home"
    with pytest.raises(SkillOptError) as raised:
        local_server.start(home, env, timeout_s=300)
    message = str(raised.value)
    assert "exited (code 1) before it answered" in message
    assert "this Prefect is broken" in message  # the tail of its output
    assert not (home / local_server.RECORD).exists()
