"""The Temporal client factory: one data converter for the API, the worker and the tests."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from config.settings import Settings


async def connect_client(settings: Settings) -> Client:
    api_key = settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None
    return await Client.connect(
        settings.temporal_target,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        tls=settings.temporal_tls or bool(api_key),
        api_key=api_key,
    )
