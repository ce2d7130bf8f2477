# ruff: noqa: RUF012  (a Django migration declares its dependencies and operations as class lists)
from django.db import migrations, models


def create_queue(apps, schema_editor):
    from pgqueue.contrib.django import client

    # In this migration's transaction: Django's connection is pgqueue's conn=.
    client().create_queue("orders", max_attempts=5, conn=schema_editor.connection)


class Migration(migrations.Migration):
    initial = True

    # The queue needs pgqueue's schema.
    dependencies = [("pgqueue", "0001_pgqueue_schema")]

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("item", models.CharField(max_length=100)),
                ("shipped", models.BooleanField(default=False)),
            ],
        ),
        migrations.RunPython(create_queue, migrations.RunPython.noop),
    ]
