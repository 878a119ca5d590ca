"""The unit tier, one folder per package of operator/src/tfdata_operator (and project/ for the repository's
own files). Packages, so that a module's test is named after it in every folder (plan/test_status.py,
autoscaling/test_status.py) and collects beside the other tiers' files of the same name."""
