# One image for every Temper process (web, workers); docker-compose.yml picks the command.
# On accelerator hosts build with e.g. `--build-arg JAX_EXTRA=cuda12` for CUDA-enabled jax.
FROM python:3.11-slim-bookworm

ARG JAX_EXTRA=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    TEMPER_DATA=/data

# PostgreSQL's client programs for manage.py temper_backup (pg_dump) and temper_restore (pg_restore, psql), of the
# compose file's server version: pg_dump refuses a server newer than itself, and Debian bookworm's is 15. From the
# PostgreSQL project's apt repository, which bookworm's postgresql-common knows how to add.
ARG POSTGRES_CLIENT_VERSION=16
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-common \
    && /usr/share/postgresql-common/pgdg/apt.postgresql.org.sh -y \
    && apt-get install -y --no-install-recommends "postgresql-client-$POSTGRES_CLIENT_VERSION" \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY webapp ./webapp
COPY worker ./worker
COPY jaxengine ./jaxengine
COPY templates ./templates
COPY static ./static
# Editable, so that settings find templates/ and static/ next to the code in /app.
RUN pip install -e . \
    && if [ -n "$JAX_EXTRA" ]; then pip install "jax[$JAX_EXTRA]==$(pip show jax | sed -n 's/^Version: //p')"; fi

RUN useradd --create-home --uid 1000 temper && mkdir -p /data && chown temper /data
USER temper
VOLUME ["/data"]
EXPOSE 8000
# --no-proxy-headers: Temper reads X-Forwarded-For itself, from TEMPER_TRUSTED_PROXIES only (webapp/core/addresses.py).
CMD ["uvicorn", "webapp.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--no-proxy-headers"]
