"""The stack's event-plane broker: a ZMQ XSUB/XPUB proxy on loopback.

Dynamo 1.6.1's event publishers (KV events, load metrics, active sequences) bind
``tcp://0.0.0.0:0`` in direct mode whatever ``DYN_EVENT_PLANE_HOST`` says (it only changes the
address they advertise). With ``DYN_ZMQ_BROKER_URL`` set they connect out to a broker instead
and listen on nothing, so the stack runs this proxy, bound to 127.0.0.1, and points every
Dynamo process at it.

    python -m deploy.stack.event_broker XSUB_PORT XPUB_PORT
"""

from __future__ import annotations

import argparse

import zmq


def broker_url(xsub_port: int, xpub_port: int, host: str = "127.0.0.1") -> str:
    """The value of DYN_ZMQ_BROKER_URL for this broker."""
    return f"xsub=tcp://{host}:{xsub_port} , xpub=tcp://{host}:{xpub_port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("xsub_port", type=int, help="publishers connect here")
    parser.add_argument("xpub_port", type=int, help="subscribers connect here")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    ctx = zmq.Context()
    publishers, subscribers = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    publishers.bind(f"tcp://{args.host}:{args.xsub_port}")
    subscribers.bind(f"tcp://{args.host}:{args.xpub_port}")
    zmq.proxy(publishers, subscribers)  # until the process is stopped


if __name__ == "__main__":
    main()
