"""Internal: the leaves every layer shares (its modules are listed in docs/architecture.md).

Not an import path for applications: the public names are on :mod:`sa_jobs`; what is
in here may move without notice.
"""
