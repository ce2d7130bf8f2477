"""The test project's settings: its database is the one $SHOP_DATABASE_DSN names.

Each test creates a database of its own and runs this project on it in a
subprocess (tests/integrations/test_django.py), so nothing here leaks into
the pytest process.
"""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["SHOP_DATABASE_DSN"])

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TEST_RUNNER = "mysite.test_runner.TestRunner"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "pgqueue.contrib.django",
    "shop",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.pop("dbname"),
        "USER": _db.pop("user", ""),
        "PASSWORD": _db.pop("password", ""),
        "HOST": _db.pop("host", ""),
        "PORT": _db.pop("port", ""),
        "OPTIONS": _db,
    },
}
if os.environ.get("SHOP_DATABASE_ENGINE") == "sqlite":  # the refusal's test
    DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}

# pgqueue: the defaults, spelled out (the DSN comes from DATABASES["default"]).
PGQUEUE = {
    "DATABASE": "default",
    "MIGRATE": True,
    "CLIENT_OPTIONS": {"max_size": 4},
}
