"""The request pipeline of one gateway, one step after the other:
tenant (API key) → parse → load images → plan reuse (keys) → route (session, image keys, load) →
send (healing a backend cache miss).

``Gateway`` owns the long-lived parts (media loader, router, reuse sender with its UUID store and
the router's record of what each backend holds, metrics); the HTTP layer (``mmgate.api.app``) calls
it. The backend order is taken right before sending, after the images loaded (fresh load counts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mmgate.api.chat_request import ChatRequest, parse_chat_request, parse_chat_request_async
from mmgate.api.image_loads import load_urls
from mmgate.api.police import refuse_transfer_params
from mmgate.app_runtime import lower_thread_priority
from mmgate.backends import CHAT_PATH, Backend, BackendReply
from mmgate.config import GatewaySettings
from mmgate.errors import (
    BackendBusyError,
    BackendConnectError,
    BackendTimeoutError,
    CacheShareError,
    ImageTooLargeError,
    InvalidRequestError,
)
from mmgate.jsonbody import HeldText
from mmgate.media import MediaLoader
from mmgate.media.audio import check_data_media, media_value
from mmgate.media.dataurl import is_data_url
from mmgate.metrics import GatewayMetrics
from mmgate.observe import note_chat, note_reuse, span, traced
from mmgate.reuse import (
    ImageSlot,
    KeySpace,
    ReuseSender,
    SlotPlan,
    TenantKeys,
    UUIDStore,
    client_cache_salt,
    known_by_uuid,
    plan_slots,
    reply_headers,
    routed_images,
)
from mmgate.reuse.videos import VideoURLs, send_healing_videos, video_refs
from mmgate.routing import RoutedImage, Router
from mmgate.store import LoadedImage

# Threads that inflate compressed request bodies (the most at once; the rest wait their turn).
INFLATE_THREADS = 2
_AUTHENTICATE = object()


def is_header_text(value: str) -> bool:
    """True for a header value that is printable text: aiohttp hands undecodable bytes over as
    lone surrogates (not printable), which nothing downstream can encode."""
    return value.isprintable()


@dataclass(slots=True)
class ChatOutcome:
    """A backend's reply (a chat pipeline's is always a success; a forwarded request's may have any
    status) plus what the gateway did to get it."""

    reply: BackendReply
    backend: Backend
    headers: dict[str, str] = field(default_factory=dict)
    on_finish: Callable[[], None] | None = None

    def finish(self) -> None:
        """The reply was delivered (or abandoned): the backend's request is over (idempotent)."""
        if self.on_finish is not None:
            done, self.on_finish = self.on_finish, None
            done()

    def close(self) -> None:
        """Free the reply's connection and end the backend's request (idempotent): however the
        delivery ended, done, client gone or cancelled."""
        self.reply.release()
        self.finish()


class Gateway:
    """One gateway: settings, media loader, router, UUID store and metrics, shared by all requests."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        loader: MediaLoader,
        router: Router,
        metrics: GatewayMetrics,
        store: UUIDStore,
        tenants: TenantKeys | None = None,
        keys: KeySpace | None = None,
        video_urls: VideoURLs | None = None,
    ) -> None:
        self.settings = settings
        self.loader = loader
        self.router = router
        self.metrics = metrics
        self.store = store
        self.tenants = tenants
        self.keys = keys if keys is not None else KeySpace()
        # Set when the gateway starts to stop: requests cut after the drain time are answered as such.
        self.stopping = False
        # The chat requests in flight (their handler tasks): what a shutdown drains, then cuts.
        self.inflight: set[asyncio.Task[object]] = set()
        # One record of what each backend holds: the router weighs it, the sender strips by it.
        self.reuse = ReuseSender(store, router.holdings, metrics, auto=settings.reuse == "auto",
                                 tenants_on=lambda: self.tenants is not None)
        # Each video key's checked URL: strips and heals (reuse.videos), on the shared tier when there is one.
        self.video_urls = video_urls if video_urls is not None else VideoURLs()
        # Compressed request bodies (--max-inflation-ratio) are inflated here, at the lowest CPU
        # priority: what one client's gzip costs comes out of what the other requests leave.
        self.inflate_pool = ThreadPoolExecutor(max_workers=INFLATE_THREADS, thread_name_prefix="mmgate-inflate",
                                               initializer=lower_thread_priority)

    def reconfigure(self, *, tenants: TenantKeys | None, keys: KeySpace) -> None:
        """Swap the API keys and the tenant secret's key space (a reload): a request already
        authenticated finishes under the key space it started with."""
        self.tenants = tenants
        self.keys = keys

    def session_id(self, headers: Mapping[str, str]) -> str | None:
        """The first present session header of the configured list (400 when it is not text)."""
        for name in self.settings.session_headers:
            value = headers.get(name)
            if value:
                if not is_header_text(value):
                    raise InvalidRequestError(
                        f"the {name} header must be printable text (UTF-8, no control characters)",
                        param=name,
                    )
                return value
        return None

    def parse(self, raw: bytes | bytearray) -> ChatRequest:
        return parse_chat_request(
            raw,
            max_images=self.settings.max_images_per_request,
            max_uuid_length=self.settings.max_uuid_length,
            max_depth=self.settings.max_json_depth,
        )

    async def parse_async(self, raw: bytes | bytearray, held: HeldText | None = None) -> ChatRequest:
        """``parse``, giving the loop back while a very large body is parsed (``held``: ``jsonbody``)."""
        settings = self.settings
        return await parse_chat_request_async(
            raw, max_images=settings.max_images_per_request, max_uuid_length=settings.max_uuid_length,
            max_depth=settings.max_json_depth, held=held)

    def default_model(self) -> str | None:
        """The model a request that names none is for: the fleet's one model, as vLLM fills in its
        served model (None while no backend has named one); 400 naming ``model`` when the fleet
        serves several."""
        models = self.router.models
        if len(models) > 1:
            raise InvalidRequestError(
                f"'model' is required: the gateway's backends serve {len(models)} models "
                "(GET /v1/models lists them)", param="model")
        return models[0] if models else None

    def authenticate(self, headers: Mapping[str, str]) -> str | None:
        """The request's tenant (None without API keys); 401 for a missing or unknown key. The HTTP
        layer calls it before reading the body."""
        if self.tenants is None:
            return None
        return self.tenants.tenant_for(headers.get("Authorization"), headers.get("x-api-key"))

    async def chat(
        self, raw: bytes | bytearray, headers: Mapping[str, str], *, tenant: str | object | None = _AUTHENTICATE,
        path: str = CHAT_PATH,
    ) -> ChatOutcome:
        """Run one chat request to a successful backend reply, or raise an ``MmgateError``.

        ``tenant``: what ``authenticate(headers)`` returned, when the caller already called it.
        ``path``: the backend endpoint the rewritten body goes to (another that reads chat
        ``messages`` and their uuids: ``/v1/embeddings``, ``/pooling``).
        """
        if tenant is _AUTHENTICATE:
            tenant = self.authenticate(headers)
        assert tenant is None or isinstance(tenant, str)
        session_id = self.session_id(headers)  # a hostile session header is a 400 before any work
        tag = self.keys.tenant_tag(tenant) if tenant is not None else None
        held = self.loader.held_images(session_id, tag)  # the parse finds repeats among them (media.repeats)
        if traced():
            with span("parse", {"mmgate.body_bytes": len(raw)}):
                request = await self.parse_async(raw, held)
        else:  # no span: no attributes made, no context entered (the common, untraced request)
            request = await self.parse_async(raw, held)
        return await self.chat_parsed(request, headers, tenant, path=path)

    async def chat_parsed(
        self, request: ChatRequest, headers: Mapping[str, str], tenant: str | None, *,
        path: str = CHAT_PATH, pin: Backend | None = None,
    ) -> ChatOutcome:
        """The pipeline after parsing (policy, load, plan, route, send/heal) for a request the
        caller already holds parsed: the mapped Messages API and the Responses API come in here.
        ``path``: the backend endpoint the rewritten body is POSTed to. ``pin``: the one backend
        that must answer (a stored response lives on one replica): no other is tried."""
        refuse_transfer_params(request.body, self.settings.allow_transfer_params)
        session_id = self.session_id(headers)
        if not request.model:
            model = self.default_model()
            if model is None:
                raise InvalidRequestError("'model' is required: no backend has listed its model yet", param="model")
            request.model = request.body["model"] = model
        tracing = note_chat(request.model, request.body.get("stream_options"))
        self.router.candidates(request.model)  # an unknown model is a 404 before any image is loaded
        keys = self.keys  # one key space for the whole request, whatever a reload swaps meanwhile
        salt = client_cache_salt(request.body)
        if tenant is not None:  # vLLM's prefix cache, partitioned per tenant (reuse.namespace)
            request.body["cache_salt"] = keys.cache_salt(tenant, salt)
        for p in request.passthrough:  # audio/video the backend fetches: policed first, data: probed
            if p.url is not None:
                p.part[p.kind] = media_value(p.kind, await self.loader.check_passthrough(p.url, param=p.param,
                                                                                         kind=p.kind))
                if is_data_url(p.url):
                    p.digest = await check_data_media(p.kind, p.url, max_bytes=self.settings.max_body_bytes,
                                                      param=p.param, media=self.settings.media)
        request.videos = video_refs(request.passthrough, keys, tenant, self.video_urls)
        plans, routed = await self._plan_images(request.slots, session_id, keys, tenant) if request.slots else ([], [])
        routed += [RoutedImage(v.key, v.weight) for v in request.videos]  # routed by video/audio affinity too
        # The router's order of preference, by the images' keys: the first is its pick, the second
        # the failover.
        if tracing:
            with span("route") as routing:
                ranked = [pin] if pin is not None else self.router.ranked(request.model, session_id, routed)
                routing.set_attribute("mmgate.backend", ranked[0].name)
        else:
            ranked = [pin] if pin is not None else self.router.ranked(request.model, session_id, routed)
        try:
            return await self._tracked_send(request, plans, ranked[0], routed, session_id, path, tracing)
        except (BackendConnectError, BackendBusyError, CacheShareError):
            # Nothing reached that backend (unreachable, whether or not it is ejected yet, every
            # connection to it in use, or the tenant past its share of its cache): try the next once.
            if len(ranked) < 2:
                raise
            return await self._tracked_send(request, plans, ranked[1], routed, session_id, path, tracing)

    async def _plan_images(
        self, slots: list[ImageSlot], session_id: str | None, keys: KeySpace, tenant: str | None,
    ) -> tuple[list[SlotPlan], list[RoutedImage]]:
        """Each image's bytes (known by its uuid, or loaded), its reuse plan and its routing key."""
        # Session scoping promises that nothing crosses sessions: no reuse of known uuids then.
        images = {} if self.settings.cache.session_scoping else known_by_uuid(self.store, slots, keys, tenant)
        tag = keys.tenant_tag(tenant) if tenant is not None else None
        images.update(await self._load_images([s for s in slots if s.index not in images], session_id, tag))
        self.check_request_pixels((s.param, images[s.index]) for s in slots if s.index in images)
        plans = plan_slots(self.store, slots, images, keys, tenant)
        return plans, routed_images(self.store, plans)

    async def _tracked_send(
        self, request: ChatRequest, plans: list[SlotPlan], backend: Backend, routed: list[RoutedImage],
        session_id: str | None, path: str, tracing: bool,
    ) -> ChatOutcome:
        """One send with the router's outstanding-request count and passive health reports."""
        router = self.router
        router.begin(backend, routed)
        try:
            sending = send_healing_videos(
                lambda: self.reuse.send(backend, request.body, plans, stream=request.stream, path=path,
                                        body_bytes=request.raw_bytes),
                request.videos, self.video_urls, self.router.holdings, backend.name, with_uuid=backend.kind == "vllm",
                strip=self.reuse.auto, on_heal=self.metrics.reuse_heals.inc)
            if tracing:
                with span("send", {"mmgate.backend": backend.name}):  # its traceparent reaches the backend
                    reply, counts = await sending
            else:
                reply, counts = await sending
        except (BackendConnectError, BackendTimeoutError):
            router.end(backend)
            router.report_failure(backend)
            raise
        except BaseException:
            router.end(backend)
            raise
        router.report_success(backend)
        # Recorded once the backend answered: a failover or a failed send records nothing.
        router.record_answered(backend, routed, session_id)
        if request.videos and backend.kind == "vllm":
            router.holdings.hold(backend.name, [(v.key, v.held_bytes) for v in request.videos])
        note_reuse(counts)
        headers = reply_headers(backend.name, counts)
        return ChatOutcome(reply=reply, backend=backend, headers=headers, on_finish=lambda: router.end(backend))

    def check_request_pixels(self, sent: Iterable[tuple[str, LoadedImage]]) -> None:
        """Every image the request sends (its param, the image) counts against
        ``--max-request-pixels``, decoded now or known already: a cached giant costs the gateway
        nothing, but the backend would process it."""
        limit = self.settings.media.max_request_pixels
        total = 0
        for param, image in sent:
            total += image.width * image.height
            if total > limit:
                raise ImageTooLargeError(f"the request's images add up to more than {limit} pixels "
                                         "(--max-request-pixels): send fewer or smaller images", param=param)

    async def _load_images(
        self, slots: list[ImageSlot], session_id: str | None, tenant_tag: str | None = None
    ) -> dict[int, LoadedImage]:
        """Load every URL-backed slot (``load_urls``)."""
        to_load = [s for s in slots if s.url is not None]
        loaded = await self.load_urls([(s.param, s.url) for s in to_load if s.url is not None], session_id, tenant_tag)
        return {slot.index: image for slot, image in zip(to_load, loaded, strict=True)}

    async def load_urls(
        self, wanted: list[tuple[str, str]], session_id: str | None, tenant_tag: str | None = None
    ) -> list[LoadedImage]:
        """Load every (param, URL) in the tenant's key space (``image_loads.load_urls``)."""
        return await load_urls(self.loader, wanted, session_id, tenant_tag)

    async def close(self) -> None:
        self.inflate_pool.shutdown(wait=False, cancel_futures=True)
        await self.router.close()
        await self.store.close()
        await self.video_urls.close()
        await self.loader.close()
