"""The one failure every lab check raises: what broke, where, expected against got, and a hint.

A LabCheckFailed is an AssertionError (pytest and nbval show it as a failed check) but it never prints bare:
its message names the check, the place (step, request, field), what the reference engine gave, what the
student's code gave, and a hint that points at the mechanism without giving the solution away.
"""
from __future__ import annotations


class LabCheckFailed(AssertionError):
    """A failed lab check. E.g. str(e) ->
    "check 'greedy tokens = reference' failed\n  where: request 0, token 3\n  expected: 11\n  got: 42\n  hint: ..."
    """

    def __init__(self, check: str, where: str, expected, got, hint: str):
        self.check, self.where, self.expected, self.got, self.hint = check, where, expected, got, hint
        super().__init__(str(self))

    def __str__(self) -> str:
        return (f"check {self.check!r} failed\n  where: {self.where}\n  expected: {self.expected}\n"
                f"  got: {self.got}\n  hint: {self.hint}")
