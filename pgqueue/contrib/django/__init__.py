"""pgqueue in a Django project: migrations, sends that join `atomic()`, a worker command.

Add `"pgqueue.contrib.django"` to INSTALLED_APPS; docs/integrations.md has the
settings. `send()` and `send_batch()` run on Django's own connection, so inside
`transaction.atomic()` the message commits or rolls back with the block's
writes; outside one they autocommit, as Django's queries do.
"""

from __future__ import annotations

from pgqueue.contrib.django.client import client, close, send, send_batch

__all__ = ["client", "close", "send", "send_batch"]
