#!/usr/bin/env python3
"""SimGrid platform and hostfile for N nodes of a machine, for SMPI's `smpirun`.

    platform.py --platform frontier|emulated --nodes N --xml OUT.xml --hostfile OUT.txt

Each node is a zone of one host per GPU (rank), a link each way between every pair of GPUs (the GPU
fabric's pair bandwidths) and a link each way from each GPU to the node's network interface (the zone's
router). Above the node the levels of the machine, each a Floyd zone around a hub router: a node joins
its switch through an up and a down link carrying all of its NICs (rail affinity is not modelled: the
node's NICs are pooled); a switch joins its dragonfly group through up and down links carrying the
switch's share of the group's bandwidth (the taper); a group joins the system through up and down links
carrying the group's global ports (traffic spread over every global link, as adaptive routing does).

frontier: OLCF Frontier, read from the planner's preset (piper-planner/presets/platforms/frontier.toml,
its sources named there): 8 GCDs per node with the preset's Infinity Fabric pair bandwidths (50-200
GB/s), each GCD reaching the NICs at its affine NIC's 25 GB/s, 4 Slingshot-11 NICs of 25 GB/s per node
pooled (100 GB/s up and down), 4 nodes per switch whose links into the group carry the preset's group
level per node (4 x 75 GB/s), dragonfly groups of 4 x 32 = 128 nodes, each group's 32 switches x ~9
global ports x 25 GB/s (7.2 TB/s up and down per group, the preset's 57 GB/s per node). Latencies are
the preset's (assumed there): a GCD pair link has `intra_node_latency_us`; the four links between GCDs
of two nodes on one switch add up to the switch level's `latency_us` (a quarter each), the switch's up
and down links add the rest of the group level's, and the group's global links the rest of the system
level's.

emulated: scripts/emulate-fabric.sh's fabric (2 ranks per node over loopback, assumed 10 GB/s; one
shaped link per node of --rate-gbit, 1 Gbit/s by default, into one switch): one group.
"""
import argparse
import sys


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def frontier():
    """The hardware figures of the planner's Frontier preset: GCD pairs, NICs, levels."""
    import tomllib
    import pathlib
    toml = pathlib.Path(__file__).resolve().parents[2] / "piper-planner/presets/platforms/frontier.toml"
    t = tomllib.loads(toml.read_text())["topology"]
    # The node's NICs pooled; a GCD reaches them through its affine NIC's share. Routes: GCD pair, one
    # link; on one switch, tonic + up + down + fromnic; across switches also sup + sdown; across groups
    # also gup + gdown.
    switch_us, group_us, system_us = (t[level]["latency_us"] for level in ("switch", "group", "system"))
    per_switch = t["nodes_per_switch"]
    return dict(gpus=8, pair_gbs=t["intra_node_gbs"], pair_us=t["intra_node_latency_us"],
                gpu_us=switch_us / 4, gpu_nic_gbs=t["nic_gbs"],
                node_gbs=t["nic_gbs"] * t["nics_per_node"], node_us=switch_us / 4,
                switch_nodes=per_switch, switch_gbs=per_switch * t["group"]["node_gbs"],
                switch_us=max(group_us - switch_us, 0.0) / 2,
                group_nodes=per_switch * t["switches_per_group"], group_gbs=32 * 9 * 25.0,
                group_us=max(system_us - group_us, 0.0) / 2)


def emulated(rate_gbit):
    return dict(gpus=2, pair_gbs=[[0.0, 10.0], [10.0, 0.0]], pair_us=5.0, gpu_us=5.0, gpu_nic_gbs=10.0,
                node_gbs=rate_gbit / 8.0, node_us=20.0, switch_nodes=1 << 30, switch_gbs=1e6, switch_us=0.0,
                group_nodes=1 << 30, group_gbs=1e6, group_us=0.0)


def node_zone(n, m):
    """One node: a host per GPU, a link each way between every pair of GPUs, a link each way between
    each GPU and the node's network interface (router nic-n)."""
    g = m["gpus"]
    lines = [f'        <zone id="node-{n}" routing="Full">']
    lines += [f'          <host id="gpu-{n}-{k}" speed="1Gf"/>' for k in range(g)]
    lines.append(f'          <router id="nic-{n}"/>')
    for a in range(g):
        for b in range(g):
            if a != b:
                lines.append(f'          <link id="if-{n}-{a}-{b}" bandwidth="{m["pair_gbs"][a][b]}GBps" latency="{m["pair_us"]}us"/>')
        for way in ("tonic", "fromnic"):
            lines.append(f'          <link id="{way}-{n}-{a}" bandwidth="{m["gpu_nic_gbs"]}GBps" latency="{m["gpu_us"]}us"/>')
    for a in range(g):
        for b in range(g):
            if a != b:
                lines.append(f'          <route src="gpu-{n}-{a}" dst="gpu-{n}-{b}" symmetrical="NO"><link_ctn id="if-{n}-{a}-{b}"/></route>')
        lines.append(f'          <route src="gpu-{n}-{a}" dst="nic-{n}" symmetrical="NO"><link_ctn id="tonic-{n}-{a}"/></route>')
        lines.append(f'          <route src="nic-{n}" dst="gpu-{n}-{a}" symmetrical="NO"><link_ctn id="fromnic-{n}-{a}"/></route>')
    lines.append('        </zone>')
    return "\n".join(lines)


def hub(router, indent):
    """A zone holding one router (a zone of zones may not hold routers itself)."""
    return f'{indent}<zone id="hub-{router}" routing="None"><router id="{router}"/></zone>'


def star(hub_router, members, gateways, ups, downs, indent):
    """Routes between each member zone (through its gateway router) and the hub, over its up and down links."""
    lines = []
    for member, gateway, u, d in zip(members, gateways, ups, downs):
        lines.append(f'{indent}<zoneRoute src="{member}" dst="hub-{hub_router}" gw_src="{gateway}" gw_dst="{hub_router}"'
                     f' symmetrical="NO"><link_ctn id="{u}"/></zoneRoute>')
        lines.append(f'{indent}<zoneRoute src="hub-{hub_router}" dst="{member}" gw_src="{hub_router}" gw_dst="{gateway}"'
                     f' symmetrical="NO"><link_ctn id="{d}"/></zoneRoute>')
    return lines


def switch_zone(s, nodes, m):
    """One switch: its nodes, each joined to the switch router by an up and a down link."""
    lines = [f'      <zone id="switch-{s}" routing="Floyd">']
    lines += [node_zone(n, m) for n in nodes]
    lines.append(hub(f"sw-{s}", "        "))
    for n in nodes:
        for way in ("up", "down"):
            lines.append(f'        <link id="{way}-{n}" bandwidth="{m["node_gbs"]}GBps" latency="{m["node_us"]}us"/>')
    lines += star(f"sw-{s}", [f"node-{n}" for n in nodes], [f"nic-{n}" for n in nodes],
                  [f"up-{n}" for n in nodes], [f"down-{n}" for n in nodes], "        ")
    lines.append('      </zone>')
    return lines


def group_zone(g, switches, m):
    """One dragonfly group: its switches, each joined to the group router by an up and a down link."""
    lines = [f'    <zone id="group-{g}" routing="Floyd">']
    for s, nodes in switches:
        lines += switch_zone(s, nodes, m)
    lines.append(hub(f"grp-{g}", "      "))
    for s, _ in switches:
        for way in ("sup", "sdown"):
            lines.append(f'      <link id="{way}-{s}" bandwidth="{m["switch_gbs"]}GBps" latency="{m["switch_us"]}us"/>')
    ids = [s for s, _ in switches]
    lines += star(f"grp-{g}", [f"switch-{s}" for s in ids], [f"sw-{s}" for s in ids],
                  [f"sup-{s}" for s in ids], [f"sdown-{s}" for s in ids], "      ")
    lines.append('    </zone>')
    return lines


def platform(m, num_nodes):
    per_switch, per_group = m["switch_nodes"], m["group_nodes"]
    groups = []
    for start in range(0, num_nodes, per_group):
        nodes = list(range(start, min(start + per_group, num_nodes)))
        groups.append([(nodes[i] // per_switch, nodes[i:i + per_switch]) for i in range(0, len(nodes), per_switch)])
    lines = ["<?xml version='1.0'?>", '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
             '<platform version="4.1">', '  <zone id="system" routing="Floyd">']
    for g, switches in enumerate(groups):
        lines += group_zone(g, switches, m)
    for g in range(len(groups)):
        for way in ("gup", "gdown"):
            lines.append(f'    <link id="{way}-{g}" bandwidth="{m["group_gbs"]}GBps" latency="{m["group_us"]}us"/>')
    lines.append(hub("global", "    "))
    ids = range(len(groups))
    lines += star("global", [f"group-{g}" for g in ids], [f"grp-{g}" for g in ids],
                  [f"gup-{g}" for g in ids], [f"gdown-{g}" for g in ids], "    ")
    lines += ['  </zone>', '</platform>', '']
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--platform", required=True, choices=["frontier", "emulated"])
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--rate-gbit", type=float, default=1.0, help="emulated: the shaped link of each node")
    p.add_argument("--xml", required=True)
    p.add_argument("--hostfile", required=True)
    a = p.parse_args()
    if a.nodes < 1:
        fail(f"--nodes {a.nodes}: must be >= 1")
    if not a.rate_gbit > 0:
        fail(f"--rate-gbit {a.rate_gbit}: must be > 0")
    m = frontier() if a.platform == "frontier" else emulated(a.rate_gbit)
    with open(a.xml, "w") as f:
        f.write(platform(m, a.nodes))
    with open(a.hostfile, "w") as f:
        f.writelines(f"gpu-{n}-{k}\n" for n in range(a.nodes) for k in range(m["gpus"]))


if __name__ == "__main__":
    main()
