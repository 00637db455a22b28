"""Django settings as keelway runs the site: its database is the instance's KEELWAY_DB,
its secret key the instance's own KEELWAY_INSTANCE_KEY."""

import os

SECRET_KEY = os.environ.get("KEELWAY_INSTANCE_KEY", "only-for-manage-py-outside-keelway")
DEBUG = False
ALLOWED_HOSTS = ["*"]  # keelway's router passes only the hosts it serves this app at
INSTALLED_APPS = ["django.contrib.contenttypes", "polls"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "guide_site.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("KEELWAY_DB", "db.sqlite3")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
