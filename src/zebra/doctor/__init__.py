"""`zebra doctor`: one check per concern of the machine, each with a status, what was found and the fix.

from zebra.doctor import run_checks
for check in run_checks(data_dir=Path("data"), sample="10BT", required=["docker"]):
    print(check.name, check.status, check.detail, check.fix)

Checks never raise for something absent: they say so (warn). Heavy packages are imported inside checks.
"""

from zebra.doctor.check import Check, Status
from zebra.doctor.run import CHECK_NAMES, promote, run_checks

__all__ = ["CHECK_NAMES", "Check", "Status", "promote", "run_checks"]
