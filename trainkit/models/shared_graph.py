"""One graph for the front end to compile per kind of layer, not one per instance: a class decorator.

MindSpore's front end parses, infers and optimises every Cell instance's ``construct`` on its own: ResNet-50's 53
convolutions and 53 batch norms are 106 graphs, though they come in a handful of shapes. ``mindspore.lazy_inline``
with ``policy="front"`` compiles the instances built with the same constructor arguments to one graph, inlined
again before the back end (so the kernels, their order and the values are those of the inlined graphs). Measured
on ResNet-50's bare train step at 32x32 (``TrainOneStepCell``, 2-core CPU): the front end's 6.3 s came to 4.3 s.

MindSpore keys the shared graph by class name and constructor arguments alone, so two batch norms built alike,
one of them later put in eval mode, would share the train-mode graph (tried: the eval-mode one normalised with
the batch's statistics). The key here adds what ``construct`` reads that the constructor does not decide: the
cell's flags (``set_train``'s mode, ``to_float``'s type). An instance of a subclass gets a graph of its own (its own
attributes may change its graph with no constructor argument showing it), as does one whose class was replaced
after it was built (amp O1 rewrites cells into new classes).
"""
from __future__ import annotations

import mindspore as ms

__all__ = ["one_graph_per_arguments"]


def one_graph_per_arguments(cls: type) -> type:
    """Decorate a Cell class whose ``construct`` depends only on its constructor arguments and its flags (the
    training mode among them): its instances built alike compile to one shared graph."""
    cls.__init__ = ms.lazy_inline(cls.__init__, policy="front")

    def key(self) -> str:
        arguments = self.__dict__.get("_cell_init_args", "")
        if type(self) is not cls:  # a subclass, or a class put in its place: nothing shared
            return f"{arguments}|instance {id(self)}"
        flags = sorted(self.get_flags().items(), key=lambda item: str(item[0]))
        return f"{arguments}|flags={flags!r}"  # set_train's mode is one of them

    def set_key(self, value: str) -> None:
        self.__dict__["_cell_init_args"] = value

    cls.cell_init_args = property(key, set_key)
    return cls
