"""Keeps this node's ResourceSlices on the API server equal to what the plugin wants published.

    pub = SlicePublisher(api_client, node_name, driver_name, resync_seconds=30.0,
                         on_pass=metrics.observe_publish)  # (seconds, ok) after every pass
    pub.start()
    pub.set_desired(build_pool(devices, node_name, driver_name, options, unhealthy))
    pub.wait_until_synced(5.0); pub.stats(); pub.stop()

Threading model (the plugin daemon is thread-based, see the daemon's main module):

- ``set_desired()`` is called from any thread (discovery, the health monitor). It swaps the wanted
  slice list under a lock, bumps a version counter and sets an Event; it never blocks on the
  network. A burst of calls coalesces: the reconcile thread always works from the latest list.
- One **reconcile thread** decides every write. A pass compares this driver's slices on this node
  with the wanted ones (spec without ``pool.generation``, plus the owner reference). When anything
  differs it writes *all* wanted slices at generation G+1 (creates and updates, sent concurrently
  on a small write pool) and only then deletes the stale ones, so consumers see either the old
  complete pool or the new one, never a mix for longer than one pass. Slices of this driver on this
  node that the plugin does not want (another naming scheme, an older version) are stale. When
  nothing differs it writes nothing and adopts the existing generation: a restart with unchanged
  devices causes no churn. Errors (409s included) are retried with exponential backoff and jitter.
- One **watch thread** streams the same slices (``fieldSelector=spec.nodeName=<node>,
  spec.driver=<driver>``). Its own writes' echoes are recognised by resourceVersion; anything else
  (someone deleted or edited a slice) wakes the reconcile thread, so the slice comes back within one
  pass, not one resync period.
- The server view a pass compares against is the last list plus the pass's own writes, trusted
  only while the watch session it was taken under stays open and reports nothing foreign; a fresh
  list is taken otherwise, after any error, and at every resync period (the safety net).

Requests go through the ``kubernetes`` client's ``ApiClient`` (configuration, auth, connection
pool) as raw JSON; see :mod:`.slice_requests`.
"""

from __future__ import annotations

from dra_driver.slices import node_owner_reference

from .slice_publisher import NODE_RETRY_SECONDS, WRITE_PARALLELISM, PublisherStats, SlicePublisher
from .slice_requests import SLICES_PATH, ApiError, pool_has_devices

__all__ = [
    "NODE_RETRY_SECONDS",
    "SLICES_PATH",
    "WRITE_PARALLELISM",
    "ApiError",
    "PublisherStats",
    "SlicePublisher",
    "node_owner_reference",
    "pool_has_devices",
]
