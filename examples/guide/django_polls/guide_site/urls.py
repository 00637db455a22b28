from django.urls import path
from polls import views

urlpatterns = [path("", views.index), path("vote", views.vote), path("health", views.health)]
