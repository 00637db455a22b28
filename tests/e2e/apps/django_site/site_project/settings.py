"""A small Django site as keelway runs it: its database is the instance's KEELWAY_DB."""

import os

SECRET_KEY = os.environ.get("KEELWAY_INSTANCE_KEY", "not-a-secret-outside-keelway")
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.contenttypes", "notes"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "site_project.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["KEELWAY_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
