"""What the scheduler shows of its state: GPU rows, pod rows, totals, quotas.

The data side of the status page and its JSON API (the extender serves them:
:mod:`vgpud.extender.status` renders and routes), over one :class:`SchedulerState`.
Rows come from :mod:`vgpud.core.report`, selected by :mod:`vgpud.core.query` as steps
(the caller yields to its event loop between them). The pods holding GPUs are the
ledger's entries; the pending ones are those the last filter refused, with its reason.
The DRA nodes' GPUs and pods (:class:`~vgpud.scheduling.state.DraNodes`, when DRA is on)
are listed after the device-plugin nodes' and counted in the totals.
"""

from __future__ import annotations

from vgpud.core.query import Page, Query, Steps, select_gpus, select_pods, summary
from vgpud.core.quota import QuotaRow, quota_rows
from vgpud.core.report import PodRow
from vgpud.scheduling.state import SchedulerState


class StateViews:
    """Rows and totals of one scheduler's state, as of each call."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def pending(self) -> list[PodRow]:
        """The GPU pods the last filter found no node for, and why."""
        out = []
        for r in list(self.state.refused.values()):
            ns, _, name = r.key.partition("/")
            out.append(PodRow(ns, name, r.uid, None, "pending", r.priority, (),
                              reason=r.reason, since=r.since))
        return out

    def gpus(self, query: Query) -> Steps[Page]:
        a = self.state.alloc
        return select_gpus(a.cluster, a.ledger, query, dra=self.state.dra.rows().gpus)

    def pods(self, query: Query) -> Steps[Page]:
        return select_pods(self.state.alloc.ledger, self.pending(), query,
                           dra=self.state.dra.rows().pods)

    def quotas(self) -> list[QuotaRow]:
        held = self.state.quotas
        return quota_rows((q for qs in list(held.values()) for q in list(qs.values())),
                          self.state.alloc.ledger.namespaces())

    def summary(self) -> dict[str, int]:
        a = self.state.alloc
        dra = self.state.dra.rows()
        return summary(a.cluster, a.ledger, len(self.state.refused), dra_gpus=dra.gpus,
                       dra_pods=len(dra.pods))
