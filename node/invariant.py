"""`invariant()`: assertions that survive `python -O`.

`assert` statements vanish under -O; invariants guarding on-disk and replicated
state must not. A violated invariant means a bug in xraft (never bad user input,
which gets a typed error instead), so it raises and is never caught by the
command layer.
"""


class InvariantViolation(AssertionError):
    """Raised when an internal invariant does not hold. Always a bug."""


def invariant(condition: object, message: str = "") -> None:
    """Invariant: `condition` is truthy; otherwise raise InvariantViolation."""
    if not condition:
        raise InvariantViolation("Invariant: " + message)
