import pgqueue
from shop.models import Order

app = pgqueue.App()


@app.handler("orders")
def ship(msg: pgqueue.Message) -> None:
    Order.objects.filter(pk=msg.message["order"]).update(shipped=True)
