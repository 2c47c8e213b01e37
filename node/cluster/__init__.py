"""Sharding, pure: the slot map (slot_map), the initial placement (placement), map changes as
compare-and-set commands (changes), the slot-move state machine (slot_move) and the
rebalance/drain/add-node planners (rebalance). docs/sharding.md describes them."""
