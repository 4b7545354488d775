"""Engines that each break exactly one contract check, and the good engine they start from.

The contract suite's own tests install these as real plugins (``*.dist-info`` folders beside this
package) and assert that each fails its check and only that one. Nothing here imports torch at
module level, except the modules whose breakage is exactly that.
"""
