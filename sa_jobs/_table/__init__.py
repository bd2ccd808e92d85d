"""Internal: the table and its schema; its modules are listed
in that section of docs/architecture.md.

Not an import path for applications: the public names are on :mod:`sa_jobs`; what is
in here may move without notice.
"""
