"""The validated stack spec (a package; its parts follow in the next commits)."""

from p40fleet.spec.pins import *  # noqa: F403
from p40fleet.spec.pins import __all__  # noqa: F401
