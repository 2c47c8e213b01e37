"""The deterministic state machine: log records in, replies out.

    entry.py          the log record codec (versioned, CRC'd, bounded; batches)
    resolve.py        leader side: time stamping, refusals, blocking -> non-blocking
    blocking.py       blocking forms, their non-blocking forms and reply translation
    state_machine.py  StateMachine: apply / read / snapshot / restore
    xadd_batch.py     XADD_BATCH requests: N XADDs to one key, applied as one MULTI of them
    sessions.py       client sessions (registered, expired by replicated time) and the
                      at-most-once table (request id -> result)
    results.py        binary form of results (for the at-most-once table)
    config_set.py     CONFIG SET of the engine limits, redis 7.0's parsing and texts
    errors.py         typed errors

Pure and deterministic: no clock, randomness, I/O or threads (import-linter).
"""
