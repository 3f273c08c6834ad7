"""Verification of a provisioned host, read-only: the probe's wire format (``probe``), the check
vocabulary (``check``), the checks, one module per component (``checks``, the Ray ones too),
and the ordered registry that runs them (``run``). Pure: no pyinfra here (``facts.verify`` runs
the probe)."""

#: Set to ``0``, the verification after a run prints no fleet table (``python -m p40fleet.verify``
#: prints its own from the report).
TABLE_ENV = "P40FLEET_VERIFY_TABLE"
