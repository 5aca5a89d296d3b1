"""HTTP to the servers the tool starts or checks: loopback never goes through a proxy.

A company machine often sets `http_proxy` without a `no_proxy` for 127.0.0.1; urllib would send a
request for our own server to that proxy, which cannot reach it (or swallows it). Every request of
serve, smoke, bench and the tests goes through `opener_for`. urllib and options.is_loopback; importing this
module costs about 25 ms, so the launcher imports it only once vLLM has started.
"""

from __future__ import annotations

import urllib.parse
import urllib.request

from gptoss_patch.launcher.options import is_loopback as loopback_host

HEALTH_TIMEOUT = 2.0  # seconds one /health request may take


def is_loopback(url: str) -> bool:
    """Whether `url` names this machine (options.is_loopback: one answer for a host, bound or asked)."""
    return loopback_host(urllib.parse.urlsplit(url).hostname or "")


def opener_for(url: str) -> urllib.request.OpenerDirector:
    """No proxy for loopback (a corporate http_proxy must not intercept 127.0.0.1); environment proxies otherwise."""
    if is_loopback(url):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def get(url: str, timeout: float = HEALTH_TIMEOUT) -> int | None:
    """The HTTP status of GET `url` (an error status included), or None when nothing answered."""
    import urllib.error

    try:
        with opener_for(url).open(urllib.request.Request(url), timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:  # URLError, refused, reset, timed out: not up (yet)
        return None


def healthy(health_url: str, timeout: float = HEALTH_TIMEOUT) -> bool:
    """vLLM's /health (the full URL, e.g. http://127.0.0.1:8000/health) answers 200."""
    return get(health_url, timeout) == 200
