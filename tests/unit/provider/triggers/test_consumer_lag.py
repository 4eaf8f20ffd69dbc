"""The lag trigger serialises without credentials and fires once the measured lag is within the limit."""

from __future__ import annotations

import asyncio

from exactly_once_provider.kafka.lag import Lag
from exactly_once_provider.triggers import consumer_lag
from exactly_once_provider.triggers.consumer_lag import ConsumerLagTrigger


def test_serialize_round_trip():
    trigger = ConsumerLagTrigger("h:9092", ["t"], 10, sink="delta", sink_location="/d", sink_pipeline="p")
    path, kwargs = trigger.serialize()
    assert path == "exactly_once_provider.triggers.consumer_lag.ConsumerLagTrigger"
    assert ConsumerLagTrigger(**kwargs).serialize() == (path, kwargs)
    assert "password" not in str(kwargs)


def test_fires_when_lag_drops(monkeypatch):
    measured = iter([Lag({"t": {0: 50}}, {"t": {0: 10}}), Lag({"t": {0: 50}}, {"t": {0: 45}})])
    monkeypatch.setattr(consumer_lag, "measure_lag", lambda *args: next(measured))
    trigger = ConsumerLagTrigger("h:9092", ["t"], 5, sink="delta", sink_location="/d", sink_pipeline="p",
                                 poll_interval=0.01)

    async def first():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(first())
    assert payload["status"] == "ok" and payload["lag"] == 5 and payload["detail"] == "t[0] 5"
