"""The `pgmq` facade: install it over pgqueue, and move a real PGMQ's queues into pgqueue.

The facade is schema `pgmq`, holding functions with PGMQ's names and
signatures over pgqueue's own (sql/pgmq/*.sql). It is not a numbered
migration: `install` applies those files in name order, in one transaction,
under the migrators' advisory lock, and marks the schema as pgqueue's by its
comment. It never replaces a real PGMQ; `import_pgmq` moves one's queues and
archives into pgqueue, then removes it and installs the facade in its place,
all in one transaction, so a PGMQ client keeps running on the same database.

Where each part lives: `model` (constants, errors, results), `files` (the
facade's SQL), `facade` (status, install, refresh, uninstall), and the import:
`importer` (the transaction), `sources` (PGMQ's queues), `names` (the pgqueue
queue each becomes), `settings` (what is carried over), `checks` (what
refuses it) and `copying` (the rows).
"""

from __future__ import annotations

from pgqueue._pgmq.facade import install, refresh, status, uninstall
from pgqueue._pgmq.files import facade_digest, facade_dir, facade_files, latest_migration
from pgqueue._pgmq.importer import import_pgmq
from pgqueue._pgmq.model import (
    COMMENT_PREFIX,
    FACADE_VERSION,
    GROUP_HEADER,
    NEVER_POISON,
    ImportReport,
    PgmqConflict,
    PgmqImportRefused,
    PgmqStatus,
    QueueImport,
)

__all__ = [
    "COMMENT_PREFIX",
    "FACADE_VERSION",
    "GROUP_HEADER",
    "NEVER_POISON",
    "ImportReport",
    "PgmqConflict",
    "PgmqImportRefused",
    "PgmqStatus",
    "QueueImport",
    "facade_digest",
    "facade_dir",
    "facade_files",
    "import_pgmq",
    "install",
    "latest_migration",
    "refresh",
    "status",
    "uninstall",
]
