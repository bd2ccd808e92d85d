"""A FastAPI app on asyncpg that enqueues jobs in its own transactions (see README.md)."""
