"""Each worker's record of the steps it ran while a trace is open, attached from outside the runner.

`StepRecorder.attach` wraps one worker's `model_runner.execute_model` (on that object only) so that right
after each step, in the worker's own thread, it keeps when the step began and ended (time.monotonic, one clock
for every process of the machine) and what `describe` reads from the runner then: the packed batch and, under
tensor parallelism, the rank's collectives. EngineTracer takes the records oldest first, one per
update_from_output. Reading right after the step matters with async scheduling: by the time step N's output
is applied, step N+1 has run, and the runner's `last_batch` is N+1's. `detach` puts the runner's own method
back.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable


class StepRecorder:
    def __init__(self) -> None:
        self.steps: deque[dict[str, Any]] = deque()
        self._runner = None

    def attach(self, worker, describe: Callable[[Any], dict]) -> None:
        self.detach()
        runner = worker.model_runner
        execute_model = runner.execute_model

        def recorded(scheduler_output):
            began = time.monotonic()
            output = execute_model(scheduler_output)
            self.steps.append({"began": began, "ended": time.monotonic(), **describe(worker)})
            return output

        runner.execute_model, self._runner = recorded, runner

    def detach(self) -> None:
        if self._runner is not None:
            self._runner.__dict__.pop("execute_model", None)  # the class's method shows through again
            self._runner = None
        self.steps.clear()

    def take(self) -> dict[str, Any] | None:
        return self.steps.popleft() if self.steps else None
