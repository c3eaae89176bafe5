"""Public alias: the file formats live in `redwood.plan.formats`."""
from redwood.plan.formats import *  # noqa: F401,F403
from redwood.plan.formats import Acceptance, Profile, load_acceptance, load_profile  # noqa: F401
