/* cost: the roofline cost model of a node (see cost.h). */
#include "cost.h"

#include <errno.h>

double ps_cost_roofline_us(const struct ps_graph *g, uint32_t v)
{
    const struct ps_node *nd = &g->nodes[v];
    const struct ps_spec *s = g->spec;
    double flops = s && s->dev_flops > 0 ? s->dev_flops : 6.7e13;
    double bw = s && s->dev_mem_bw > 0 ? s->dev_mem_bw : 4.8e12;
    double launch = s ? s->dev_launch_us : 4.0;
    double link = s && s->link_bw > 0 ? s->link_bw : 4.5e11;
    double lat = s ? s->link_latency_us : 2.0;
    switch ((enum ps_node_kind)nd->kind) {
    case PS_NODE_COMPUTE:
    case PS_NODE_WGRAD:
    case PS_NODE_OPTIM:
    case PS_NODE_LOSS: {
        double t = nd->flops / flops, tb = nd->bytes / bw;
        return (t > tb ? t : tb) * 1e6 + launch;
    }
    case PS_NODE_RECOMPUTE:
        if (nd->phase == PS_PHASE_FWD) return 0;
        {
            double t = nd->flops / flops, tb = nd->bytes / bw;
            return (t > tb ? t : tb) * 1e6 + launch;
        }
    case PS_NODE_COPY: return nd->bytes / link * 1e6 + lat;
    case PS_NODE_WAIT:
    case PS_NODE_FORK:
    case PS_NODE_JOIN:
    case PS_NODE__COUNT: return 0;
    }
    return 0;
}

int ps_cost_fill_roofline(const struct ps_graph *g, double *cost)
{
    if (!cost) return -ENOMEM;
    for (uint32_t v = 0; v < g->n_nodes; v++) cost[v] = ps_cost_roofline_us(g, v);
    return 0;
}
