"""A project's own tests, as `manage.py test` runs them (test_django.py runs this one)."""

from django.db import connection
from django.test import TestCase

from pgqueue.contrib.django import client


class PlaceOrderTests(TestCase):
    def test_an_order_is_sent_to_be_shipped(self) -> None:
        response = self.client.post("/orders/", {"item": "book"}, content_type="application/json")
        self.assertEqual(response.status_code, 200)
        # The test's transaction holds the message: read it on the same connection.
        sent = client().read("orders", qty=10, conn=connection)
        self.assertEqual([m.message for m in sent], [{"order": response.json()["order"]}])
