"""``spec.networkPolicy``: who may reach the servers, and what the servers may not reach (egress)."""

from __future__ import annotations

import ipaddress
from typing import Any

from tfdata_operator.api import coretypes
from tfdata_operator.api.coretypes import describe
from tfdata_operator.api.spec.reader import Reader
from tfdata_operator.api.spec.types import DEFAULT_EGRESS_EXCEPT, MAX_EGRESS_EXCEPT, EgressSpec, NetworkPolicySpec


def parse_network_policy(r: Reader) -> NetworkPolicySpec:
    enabled = r.boolean("enabled", True)
    peers = r.raw("from")
    egress = _egress(r.child("egress")) if r.has("egress") else None
    r.finish()
    if egress is not None and not enabled:
        r.problems.append(
            f"{r.path}.egress.enabled needs {r.path}.enabled: the egress rules are part of the service's "
            f"NetworkPolicy, which {r.path}.enabled false does not create"
        )
    if peers is None:
        return NetworkPolicySpec(enabled=enabled, egress=egress)
    if not isinstance(peers, list) or len(peers) > 16:
        r.problems.append(f"{r.path}.from must be a list of at most 16 NetworkPolicy peers")
        return NetworkPolicySpec(enabled=enabled, egress=egress)
    found = [
        p
        for i, peer in enumerate(peers)
        for p in coretypes.problems(peer, coretypes.NETWORK_POLICY_PEER, f"{r.path}.from[{i}]")
    ]
    r.problems.extend(found)
    return NetworkPolicySpec(enabled=enabled, extra_from=() if found else tuple(peers), egress=egress)


def _egress(r: Reader) -> EgressSpec | None:
    """spec.networkPolicy.egress; None when it is not enabled."""
    enabled = r.boolean("enabled", False)
    value = r.raw("except")
    r.finish()
    if value is None:
        value = list(DEFAULT_EGRESS_EXCEPT)
    if not isinstance(value, list) or len(value) > MAX_EGRESS_EXCEPT:
        r.problems.append(f"{r.path}.except must be a list of at most {MAX_EGRESS_EXCEPT} CIDRs")
        return None
    cidrs = []
    for i, item in enumerate(value):
        problem = _cidr_problem(item)
        if problem:
            r.problems.append(f"{r.path}.except[{i}] {problem}")
        else:
            cidrs.append(item)
    if len(set(cidrs)) != len(cidrs):
        r.problems.append(f"{r.path}.except lists a CIDR twice: {sorted(c for c in set(cidrs) if cidrs.count(c) > 1)}")
    return EgressSpec(except_=tuple(cidrs)) if enabled else None


def _cidr_problem(value: Any) -> str | None:
    """Why ``value`` is not a CIDR that a NetworkPolicy's ipBlock.except accepts within 0.0.0.0/0 or ::/0."""
    example = "such as 169.254.169.254/32 or fd00:ec2::254/128"
    if not isinstance(value, str) or "/" not in value or len(value) > 64:
        return f"must be a CIDR {example} (an address, '/', a prefix length), got {describe(value)}"
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"must be a CIDR {example} (an address, '/', a prefix length), got {value!r}"
    if network.prefixlen == 0:
        return f"must be narrower than /0 (the egress rule allows every address but these), got {value!r}"
    if str(network) != value:
        return f"must be written {str(network)!r} (its network's first address, in canonical form), got {value!r}"
    return None
