"""The tests' TCP proxy: forwards 127.0.0.1:LISTEN to 127.0.0.1:TARGET.
SIGUSR1 blackholes it (stops forwarding in both directions but keeps every
socket open, as a dead network path does), SIGUSR2 resumes forwarding.
Prints READY once listening."""
import asyncio
import signal
import sys

listen, target = int(sys.argv[1]), int(sys.argv[2])
flowing = asyncio.Event()


async def pump(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await flowing.wait()     # blackholed: hold the data, send nothing
            writer.write(data)
            await writer.drain()
    except Exception:
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(creader, cwriter):
    try:
        sreader, swriter = await asyncio.open_connection("127.0.0.1", target)
    except Exception:
        cwriter.close()
        return
    await asyncio.gather(pump(creader, swriter), pump(sreader, cwriter))


async def main():
    loop = asyncio.get_running_loop()
    flowing.set()
    loop.add_signal_handler(signal.SIGUSR1, flowing.clear)
    loop.add_signal_handler(signal.SIGUSR2, flowing.set)
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("READY", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
