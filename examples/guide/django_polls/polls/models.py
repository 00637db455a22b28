from django.db import models


class Vote(models.Model):
    choice = models.CharField(max_length=100)
