"""The connection to the API server: configuration, request budget, error mapping.

``KubeClient`` wraps one kubernetes_asyncio ``ApiClient``. Every request goes
through ``call`` (a generated API method, e.g. ``client.core.patch_namespaced_pod``)
or ``request`` (a raw path) or ``watch_lines`` (a streaming GET), and each of them:

- takes one token from the shared ``RequestBudget`` first;
- asks for the raw response (``_preload_content=False``) and parses the JSON body
  itself: responses stay plain dicts (cheap, and immune to the generated models'
  deserialisation bugs such as the Binding one);
- maps failures to ``vgpud.kube.errors`` (``ApiException``/aiohttp never escape).

A client is one API server to everything that shares it, so it also keeps what they
learn about that server: its version (``server_version``: ``GET /version`` once per
client, cached) and whether it serves streaming lists (``watch_list_ignored_until``,
set by an informer that found its ``sendInitialEvents`` ignored, read by all of them;
see ``vgpud.kube.cache``).

Configuration comes from ``--kubeconfig PATH``, else the in-cluster service
account, else ``$KUBECONFIG``, else a ``ConfigError`` saying so.

Usage::

    async with KubeClient.connect(kubeconfig) as kube:
        pod = await kube.call(kube.core.read_namespaced_pod, "p", "default")
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import anyio
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from yarl import URL

from vgpud.kube.budget import RequestBudget
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import (
    ApiError,
    ConfigError,
    ConnectionFailed,
    Unavailable,
    error_for_status,
    from_api_exception,
)

Json = dict[str, Any]

_NO_CONFIG = (
    "no Kubernetes configuration found: pass --kubeconfig PATH, run inside a pod "
    "(in-cluster service account), or set $KUBECONFIG"
)


async def load_configuration(
    kubeconfig: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> k8s.Configuration:
    """A client configuration: ``kubeconfig``, else in-cluster, else ``$KUBECONFIG``."""
    env = os.environ if environ is None else environ
    configuration = cast(k8s.Configuration, type.__call__(k8s.Configuration))
    try:
        if kubeconfig:
            path = Path(kubeconfig)
            if not await anyio.Path(path).is_file():
                raise ConfigError(f"--kubeconfig {path}: no such file")
            await k8s_config.load_kube_config(
                config_file=str(path), client_configuration=configuration, persist_config=False
            )
        elif env.get("KUBERNETES_SERVICE_HOST"):
            load_incluster: Callable[..., None] = k8s_config.load_incluster_config
            load_incluster(client_configuration=configuration, environ=env)
        elif env.get("KUBECONFIG"):
            await k8s_config.load_kube_config(
                config_file=env["KUBECONFIG"],
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            raise ConfigError(_NO_CONFIG)
    except ConfigException as exc:
        raise ConfigError(f"cannot load the Kubernetes configuration: {exc}") from exc
    except yaml.YAMLError as exc:  # a kubeconfig that is not YAML: the parser says where
        raise ConfigError(f"cannot load the Kubernetes configuration: the kubeconfig is not "
                          f"YAML: {exc}") from exc
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"cannot load the Kubernetes configuration: {exc!r}") from exc
    return configuration


def configuration_for_url(url: str, token: str | None = None) -> k8s.Configuration:
    """A plain configuration for ``url`` (tests, the stand-in, local proxies)."""
    configuration = cast(k8s.Configuration, type.__call__(k8s.Configuration, host=url))
    if token:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return configuration


@dataclass(frozen=True, slots=True)
class ServerVersion:
    """What ``GET /version`` says: ``major``/``minor`` as numbers (a provider's
    ``"27+"`` reads as 27; where they are missing, ``gitVersion`` ``v1.27.3-eks-…``)."""

    major: int
    minor: int
    git_version: str = ""

    def at_least(self, major: int, minor: int) -> bool:
        return (self.major, self.minor) >= (major, minor)

    def __str__(self) -> str:
        return self.git_version or f"v{self.major}.{self.minor}"

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> ServerVersion | None:
        """The version in a ``/version`` answer; None when it names none."""
        git = str(body.get("gitVersion") or "")
        major = re.match(r"\d+", str(body.get("major") or ""))
        minor = re.match(r"\d+", str(body.get("minor") or ""))
        if major and minor:
            return cls(int(major[0]), int(minor[0]), git)
        semver = re.match(r"v?(\d+)\.(\d+)", git)
        if semver:
            return cls(int(semver[1]), int(semver[2]), git)
        return None


class KubeClient:
    """One API connection with a request budget and mapped errors."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        budget: RequestBudget | None = None,
        request_timeout: float = 30.0,
    ) -> None:
        self.api = api
        self.budget = budget if budget is not None else RequestBudget()
        self.request_timeout = request_timeout
        self._version: ServerVersion | None = None
        self._version_known = False
        self._version_lock: anyio.Lock | None = None
        # Until this time (on the informers' clock) the server is known to ignore
        # ``sendInitialEvents``: every informer on this client lists instead of asking.
        self.watch_list_ignored_until: float | None = None

    async def server_version(self) -> ServerVersion | None:
        """The API server's version, asked once (``GET /version``) and cached.

        None when the server does not say: the request refused (a 4xx) or an answer
        without a version, both cached; a failure that may pass (unreachable,
        throttled, 5xx) is not cached, so the next call asks again."""
        if self._version_known:
            return self._version
        if self._version_lock is None:
            self._version_lock = anyio.Lock()
        async with self._version_lock:
            if not self._version_known:
                try:
                    body = await self.request("GET", "/version")
                except Unavailable:
                    return None
                except ApiError:
                    body = {}
                self._version = ServerVersion.parse(body)
                self._version_known = True
        return self._version

    # The generated API classes, made on first use: the core one alone is 12 MiB of
    # code, and the daemons' hot paths use raw paths (``request``) instead.
    @functools.cached_property
    def core(self) -> Any:
        return k8s.CoreV1Api(self.api)

    @functools.cached_property
    def coordination(self) -> Any:
        return k8s.CoordinationV1Api(self.api)

    @functools.cached_property
    def admission(self) -> Any:
        return k8s.AdmissionregistrationV1Api(self.api)

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        kubeconfig: str | Path | None = None,
        *,
        qps: float = 500.0,
        burst: int = 1000,
        clock: Clock = SYSTEM_CLOCK,
        request_timeout: float = 30.0,
        environ: Mapping[str, str] | None = None,
    ) -> AsyncIterator[KubeClient]:
        """Load the configuration (see module docstring) and open a client."""
        configuration = await load_configuration(kubeconfig, environ=environ)
        async with cls.from_configuration(
            configuration, qps=qps, burst=burst, clock=clock, request_timeout=request_timeout
        ) as kube:
            yield kube

    @classmethod
    @asynccontextmanager
    async def from_configuration(
        cls,
        configuration: k8s.Configuration,
        *,
        qps: float = 500.0,
        burst: int = 1000,
        clock: Clock = SYSTEM_CLOCK,
        request_timeout: float = 30.0,
    ) -> AsyncIterator[KubeClient]:
        budget = RequestBudget(qps, burst, clock=clock)
        async with k8s.ApiClient(configuration=configuration) as api:
            _resolve_proxy_once(api, configuration)
            yield cls(api, budget=budget, request_timeout=request_timeout)

    @classmethod
    def for_url(
        cls,
        url: str,
        *,
        token: str | None = None,
        qps: float = 500.0,
        burst: int = 1000,
        clock: Clock = SYSTEM_CLOCK,
        request_timeout: float = 30.0,
    ) -> Any:
        """``async with KubeClient.for_url(api.url) as kube``: no kubeconfig needed."""
        return cls.from_configuration(
            configuration_for_url(url, token),
            qps=qps,
            burst=burst,
            clock=clock,
            request_timeout=request_timeout,
        )

    # -- requests ---------------------------------------------------------------------

    async def _send(self, send: Callable[[], Awaitable[Any]]) -> aiohttp.ClientResponse:
        await self.budget.acquire()
        try:
            response: aiohttp.ClientResponse = await send()
        except ApiException as exc:
            raise from_api_exception(exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConnectionFailed(f"cannot reach the API server: {exc!r}") from exc
        return response

    async def _finish(self, response: aiohttp.ClientResponse) -> Json:
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConnectionFailed(f"the API server connection broke: {exc!r}") from exc
        finally:
            response.release()
        if not 200 <= response.status <= 299:
            raise error_for_status(response.status, data, response.headers)
        if not data:
            return {}
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise ConnectionFailed(f"the API server sent invalid JSON: {exc}") from exc
        return parsed if isinstance(parsed, dict) else {"items": parsed}

    async def call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Json:
        """Call a generated API method; returns the response body as a dict."""
        kwargs["_preload_content"] = False
        kwargs.setdefault("_request_timeout", self.request_timeout)
        response = await self._send(lambda: fn(*args, **kwargs))
        return await self._finish(response)

    async def _raw(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        limit: Any,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        return await self._send(
            lambda: self.api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=limit,
            )
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Json:
        """A request to a raw API path (``/api/v1/nodes``...); returns the body."""
        response = await self._raw(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            limit=self.request_timeout,
        )
        return await self._finish(response)

    @asynccontextmanager
    async def watch_lines(
        self, path: str, *, query: Mapping[str, str], max_seconds: float
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Open a streaming GET; yields an iterator over its newline-delimited lines.

        ``max_seconds`` bounds the whole stream (pass more than ``timeoutSeconds``).
        A failure status raises the mapped error before anything is yielded.
        """
        response = await self._raw(
            "GET",
            path,
            query=query,
            body=None,
            content_type=None,
            limit=aiohttp.ClientTimeout(total=max_seconds, sock_connect=self.request_timeout),
        )
        try:
            if not 200 <= response.status <= 299:
                data = await response.read()
                raise error_for_status(response.status, data, response.headers)
            yield _lines(response)
        finally:
            response.release()


def _resolve_proxy_once(api: Any, configuration: Any) -> None:
    """kubernetes_asyncio's session trusts the environment, so aiohttp looks up the
    proxy variables and reads ``~/.netrc`` in a worker thread on *every* request (two
    thread hops per bind). The API server's URL does not change: resolve its proxy
    once here (``HTTPS_PROXY``/``NO_PROXY`` as aiohttp reads them; an API server
    authenticates by token or certificate, never netrc) and stop the per-request
    lookups."""
    rest: Any = getattr(api, "rest_client", None)
    session: Any = getattr(rest, "pool_manager", None)
    if rest is None or session is None or not hasattr(session, "_trust_env"):
        return  # another client layout: leave it as it is
    if not getattr(rest, "proxy", None):
        try:
            proxy, auth = get_env_proxy_for_url(URL(configuration.host))
        except LookupError:
            pass  # no proxy for the API server
        else:
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": auth.encode()}
    session._trust_env = False


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        while True:
            line = await response.content.readline()
            if not line:
                return
            if line.strip():
                yield line
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ConnectionFailed(f"the watch connection broke: {exc!r}") from exc
