import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from pgqueue.contrib.django import send
from shop.models import Order


def place_order(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(item=data["item"])
        # Same connection, same transaction: if anything below raises, the
        # order row and the message are both rolled back.
        send("orders", {"order": order.pk})
        if data.get("fail"):
            raise ValueError("payment declined")
    return JsonResponse({"order": order.pk})
