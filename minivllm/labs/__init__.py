"""Labs students do: build a mechanism, break one, graded inside the real engine (issue #16).

Each lab is one exercise file in `exercises/` (nbgrader style: the reference body between `### BEGIN SOLUTION`
and `### END SOLUTION`); `student.py` writes the student copies, `grader.py` plugs a submission's functions into
the engine in place of ours and runs the lab's checks, `faults.py` holds the named faults.
`python -m minivllm.labs --help` is the instructors' tool.
"""
from __future__ import annotations

import contextlib
from unittest import mock

from minivllm.labs.errors import LabCheckFailed

__all__ = ["LabCheckFailed", "inject"]


@contextlib.contextmanager
def inject(fault: str):
    """Switch one named fault on inside the engine (in-process: LLM(..., multiprocess=False)):
        with inject("preempt-append"): llm.generate(...)
    """
    from minivllm.labs.faults import FAULTS
    from minivllm.labs.registry import LABS
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: choose one of {sorted(FAULTS)}")
    lab_id, func_name, broken, _ = FAULTS[fault]
    targets = LABS[lab_id].targets.get(func_name, [])
    with contextlib.ExitStack() as stack:
        for obj, attr in targets:
            stack.enter_context(mock.patch.object(obj, attr, broken))
        yield
