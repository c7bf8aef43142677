"""How a lost node is named (the GCS's node table, as ``ray.nodes()`` returns it)."""

from __future__ import annotations

from rayseq.distributed.groups.placement import describe_node


def test_a_node_is_named_by_id_address_and_custom_resources():
    node = {"NodeID": "3f2a", "Alive": True, "NodeManagerAddress": "10.0.0.7",
            "Resources": {"CPU": 8.0, "GPU": 1.0, "memory": 1e9, "object_store_memory": 1e9, "node:10.0.0.7": 1.0,
                          "node:__internal_head__": 1.0, "accelerator_type:A100": 1.0, "node_w1": 1.0, "pool": 4.0}}
    assert describe_node(node) == "node 3f2a (10.0.0.7, node_w1, pool)"
    assert describe_node({"NodeID": "ab", "NodeManagerAddress": "10.0.0.8", "Resources": {"CPU": 2.0}}) == (
        "node ab (10.0.0.8)")
