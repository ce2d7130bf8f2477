from django.test.runner import DiscoverRunner

import pgqueue.contrib.django


class TestRunner(DiscoverRunner):
    def teardown_databases(self, old_config, **kwargs):
        # Postgres drops no database someone is connected to: close pgqueue's pool first.
        pgqueue.contrib.django.close()
        super().teardown_databases(old_config, **kwargs)
