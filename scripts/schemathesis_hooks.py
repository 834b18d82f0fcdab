"""Schemathesis hooks for scripts/schemathesis.sh.

Long-polls are capped: a generated `wait_ms` inside its valid range (1 to
60000) is lowered to at most WAIT_CAP_MS, so a claim on an empty queue or a
read of a running job does not hold a test for up to a minute. The answer of a
long-poll after its wait is the same as after a short one, so no behaviour
goes untested; values outside the range are left alone, so the 400 and 422
answers to them are still checked.
"""

import schemathesis

WAIT_CAP_MS = 50
WAIT_MAX_MS = 60_000


def _cap(container):
    if not isinstance(container, dict):
        return
    value = container.get("wait_ms")
    if isinstance(value, bool):
        return
    if isinstance(value, int) and 0 < value <= WAIT_MAX_MS:
        container["wait_ms"] = min(value, WAIT_CAP_MS)
    elif isinstance(value, str) and value.isascii() and value.isdigit() and 0 < int(value) <= WAIT_MAX_MS:
        container["wait_ms"] = str(min(int(value), WAIT_CAP_MS))


@schemathesis.hook
def map_case(context, case):
    _cap(case.body)
    _cap(case.query)
    return case
