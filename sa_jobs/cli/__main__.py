"""``python -m sa_jobs.cli``: the same as ``sa-jobs``."""

from sa_jobs.cli import main

raise SystemExit(main())
